"""The Python API raises AutoplanError subclasses only, never a library's exception, for bad
arguments; the message is the one the CLI prints for the same input."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

import autoplan
from autoplan import sweep as sweeps
from autoplan.cli import app
from autoplan.errors import (AutoplanError, ClusterSpecError, ConstraintError, ModelFileError)

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "models" / "tiny_gpt.py")  # 4 repeated blocks
DGX1 = str(ROOT / "examples" / "clusters" / "dgx-a100-x1.yaml")
RUN = {"seq_len": 64, "global_batch": 8}


def test_estimate_with_more_stages_than_blocks_says_so_as_the_cli_does():
    with pytest.raises(ConstraintError, match="--pp 8 but the model has 4 repeated blocks") as err:
        autoplan.estimate(TINY, DGX1, {"pp": 8}, **RUN)
    result = CliRunner().invoke(app, ["estimate", TINY, DGX1, "--seq-len", "64",
                                      "--global-batch", "8", "--pp", "8"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(err.value) in " ".join(result.stderr.split())


BAD_CALLS = {
    "interleaved chunks beyond the blocks": (
        ConstraintError, lambda: autoplan.estimate(TINY, DGX1, {"pp": 2, "vpp": 4}, **RUN)),
    "solve pinned beyond the blocks": (
        ConstraintError, lambda: autoplan.solve(TINY, DGX1, pins={"pp": 8}, **RUN)),
    "a negative solver time limit": (
        ConstraintError, lambda: autoplan.solve(TINY, DGX1, time_limit_s=-1, **RUN)),
    "a GPU budget of zero": (ConstraintError, lambda: autoplan.solve(TINY, DGX1, max_gpus=0, **RUN)),
    "pins that are not a mapping": (ConstraintError, lambda: autoplan.estimate(TINY, DGX1, 42, **RUN)),
    "a cluster that is neither path nor mapping": (
        ClusterSpecError, lambda: autoplan.solve(TINY, 5, **RUN)),
    "no model": (ModelFileError, lambda: autoplan.solve(None, DGX1, **RUN)),
    "options of the wrong type": (ConstraintError, lambda: autoplan.solve(TINY, DGX1, options=5, **RUN)),
    "a global batch given as text": (
        ConstraintError, lambda: autoplan.solve(TINY, DGX1, seq_len=64, global_batch="8")),
    "a global batch range with a typo": (
        ConstraintError, lambda: autoplan.solve(TINY, DGX1, seq_len=64, global_batch={"mn": 8})),
    "sweep axes that are not a mapping": (
        ConstraintError, lambda: sweeps.sweep(TINY, DGX1, over=[1, 2], base=RUN)),
    "a negative inference context": (
        ConstraintError, lambda: autoplan.place_for_inference(TINY, DGX1, context_len=-3)),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_api_arguments_raise_autoplan_errors(case):
    expected, call = BAD_CALLS[case]
    with pytest.raises(AutoplanError) as err:
        call()
    assert isinstance(err.value, expected), repr(err.value)
    assert "Traceback" not in str(err.value) and "pydantic.dev" not in str(err.value)
