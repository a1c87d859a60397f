"""The command line: JSON on stdout only, clear errors and exit codes."""

import gc
import json

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from tests.extras import require

runner = CliRunner()
TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_solve_json_prints_one_document():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["solver"]["status"] == "OPTIMAL"


def test_estimate_json_prints_the_same_document_shape():
    result = run("estimate", TINY, DGX1, "--seq-len", 256, "--global-batch", 16, "--tp", 2,
                 "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["tp"] == 2


def test_report_names_the_parts_of_the_answer():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16)
    assert result.exit_code == 0, result.output
    for words in ("parallelism", "ZeRO stage", "step time", "MFU", "peak memory", "OPTIMAL"):
        assert words in result.stdout


def test_bad_cluster_file_is_exit_2_with_the_field(tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("gpu: a100-sxm4-80gb\nnodes: 1\ngpus_per_node: 8\n"
                   "intra_node: {link: nvswitch, bandwidth: 300}\n")
    result = run("solve", TINY, bad, "--seq-len", 256, "--global-batch", 16)
    assert result.exit_code == 2
    assert "intra_node.bandwidth" in result.stderr and "Traceback" not in result.output


def test_model_without_build_model_is_exit_2(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("import torch\n")
    result = run("solve", model, DGX1, "--seq-len", 256, "--global-batch", 16)
    assert result.exit_code == 2
    assert "build_model" in result.stderr


def test_nothing_fits_is_exit_3():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16, "--mem-limit",
                 "1GiB")
    assert result.exit_code == 3
    assert "GiB" in result.stderr


def test_search_runs_without_the_cyclic_collector_and_turns_it_back_on(monkeypatch):
    from autoplan import api
    from autoplan.errors import InfeasibleError

    during = []

    def solve(*args, **kwargs):
        during.append(gc.isenabled())
        raise InfeasibleError("nothing fits")  # the collector must come back on an error too

    monkeypatch.setattr(api, "solve", solve)
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16)
    assert result.exit_code == 3, result.output
    assert during == [False]
    assert gc.isenabled()


def test_mem_limit_without_unit_is_exit_2():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16, "--mem-limit", 80)
    assert result.exit_code == 2
    assert "--mem-limit" in result.stderr


MIXTRAL = "examples/models/hf_mixtral_tiny.py"


def test_ep_pin_reaches_the_plan_and_the_report():
    require("transformers")
    result = run("solve", MIXTRAL, DGX1, "--seq-len", 256, "--global-batch", 16, "--tp", 1,
                 "--ep", 4)
    assert result.exit_code == 0, result.output
    assert "expert parallel" in result.stdout and "4 ranks" in result.stdout


def test_ep_on_a_runtime_without_it_exits_3_naming_those_with_it():
    pytest.importorskip("transformers")
    result = run("estimate", MIXTRAL, DGX1, "--seq-len", 256, "--global-batch", 16, "--ep", 2,
                 "--runtime", "deepspeed")
    assert result.exit_code == 3, result.output
    assert "DeepSpeed has no expert parallelism; Megatron-LM and FSDP do" in \
        " ".join(result.output.split())


@pytest.mark.parametrize("model, flags, says", [
    (MIXTRAL, ["--ep", 3], "does not divide the 8 experts"),
    (MIXTRAL, ["--ep", 4, "--dp", 2], "does not divide dp*cp = 2"),
    (TINY, ["--ep", 2], "no mixture-of-experts layers"),
])
def test_bad_ep_pins_exit_2_with_one_message(model, flags, says):
    if model == MIXTRAL:
        require("transformers")
    result = run("estimate", model, DGX1, "--seq-len", 256, "--global-batch", 16, *flags)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()) and "Traceback" not in result.output
