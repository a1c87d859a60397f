"""Plans trained with one gloo process per rank match a single-process run step by step.

Expected values come from outside the code under test: the single-process reference is plain
PyTorch (model.py's model, Adam, the same batches); the parallel run must reproduce its losses
to 1e-4 relative in fp32.
"""

from pathlib import Path

import pytest

from autoplan import api
from autoplan.plan import Plan

MODELS = Path(__file__).parent / "models"
SEQ_LEN = 32
TOLERANCE = 1e-4


def stages(*sizes: int) -> list[dict]:
    """Consecutive stages of the 8-layer chain (embedding, 4 blocks, norm, head, loss)."""
    out, first = [], 0
    for size in sizes:
        out.append({"first_layer": first, "num_layers": size})
        first += size
    assert first == 8
    return out


CASES = {
    # name: (plan fields, slow?)
    "tp2_pp2_dp2": (dict(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=8,
                         num_microbatches=4, world_size=8, stages=stages(3, 5)), True),
    "tp2_sp": (dict(tp=2, pp=1, dp=1, sequence_parallel=True, micro_batch_size=2,
                    global_batch_size=4, num_microbatches=2, world_size=2,
                    recompute="full", stages=stages(8)), False),
    "pp4_interleaved": (dict(tp=1, pp=4, dp=1, vpp=2, micro_batch_size=1, global_batch_size=4,
                             num_microbatches=4, world_size=4, stages=stages(*[1] * 8)), True),
    "zero3_dp4": (dict(tp=1, pp=1, dp=4, zero_stage=3, micro_batch_size=1, global_batch_size=8,
                       num_microbatches=2, world_size=4, stages=stages(8)), True),
    "dp2_pp2_uneven": (dict(tp=1, pp=2, dp=2, micro_batch_size=1, global_batch_size=8,
                            num_microbatches=4, world_size=4, recompute="selective",
                            stages=stages(2, 6)), True),
    "dp2_partial_recompute": (dict(tp=1, pp=1, dp=2, micro_batch_size=1, global_batch_size=4,
                                   num_microbatches=2, world_size=2, recompute="full",
                                   recompute_num_layers=2, stages=stages(8)), True),
}
FAST = {("tiny_llama_gqa", "tp2_sp"), ("tiny_gpt", "zero3_dp4"),
        ("tiny_gpt", "dp2_partial_recompute")}


def _params():
    for model in ("tiny_gpt", "tiny_llama_gqa"):
        for name, (_, slow) in CASES.items():
            marks = [pytest.mark.slow] if (model, name) not in FAST else []
            yield pytest.param(model, name, marks=marks, id=f"{model}-{name}")


@pytest.mark.parametrize("model,case", list(_params()))
def test_losses_match_single_process(model, case):
    plan = Plan(**CASES[case][0])
    doc = api.verify(MODELS / f"{model}.py", plan, steps=5, seq_len=SEQ_LEN)
    assert doc["world_size"] == plan.world_size and doc["steps"] == 5
    assert len(doc["losses_parallel"]) == len(doc["losses_reference"]) == 5
    assert doc["max_rel_loss_diff"] < TOLERANCE, doc
    # the weights moved: losses are not all the same
    assert len({round(x, 4) for x in doc["losses_reference"]}) > 1
    ranks = doc["ranks"]
    assert [r["rank"] for r in ranks] == list(range(plan.world_size))
    for rank in ranks:
        assert rank["peak_bytes_measured"] > 0 and rank["peak_bytes_predicted"] > 0
        print(case, model, rank)
    print(case, model, "max_rel_loss_diff", doc["max_rel_loss_diff"])
