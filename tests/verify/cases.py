"""The verification cases: the plans the issue asks to prove, on the tiny test models.

Shared by the tests (tests/verify/test_parallel_runs.py) and the speed benchmark
(benchmarks/verify_speed.py). Micro-batch counts are the fewest each schedule needs (1F1B: one
per stage; interleaved 1F1B: a multiple of the pipeline size), so every case stays a few seconds.
"""

from pathlib import Path

from autoplan.plan import Plan

MODELS_DIR = Path(__file__).parent / "models"
MODELS = ("tiny_gpt", "tiny_llama_gqa")
SEQ_LEN = 32
STEPS = 3


def stages(*sizes: int) -> list[dict]:
    """Consecutive stages of the 8-layer chain (embedding, 4 blocks, norm, head, loss)."""
    out, first = [], 0
    for size in sizes:
        out.append({"first_layer": first, "num_layers": size})
        first += size
    assert first == 8
    return out


CASES = {
    "tp2_pp2_dp2": dict(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=4,
                        num_microbatches=2, world_size=8, stages=stages(3, 5)),
    "tp2_sp": dict(tp=2, pp=1, dp=1, sequence_parallel=True, micro_batch_size=2,
                   global_batch_size=4, num_microbatches=2, world_size=2, recompute="full",
                   stages=stages(8)),
    "pp4_interleaved": dict(tp=1, pp=4, dp=1, vpp=2, micro_batch_size=1, global_batch_size=4,
                            num_microbatches=4, world_size=4, stages=stages(*[1] * 8)),
    "zero3_dp4": dict(tp=1, pp=1, dp=4, zero_stage=3, micro_batch_size=1, global_batch_size=8,
                      num_microbatches=2, world_size=4, stages=stages(8)),
    "dp2_pp2_uneven": dict(tp=1, pp=2, dp=2, micro_batch_size=1, global_batch_size=4,
                           num_microbatches=2, world_size=4, recompute="selective",
                           stages=stages(2, 6)),
    "dp2_partial_recompute": dict(tp=1, pp=1, dp=2, micro_batch_size=1, global_batch_size=4,
                                  num_microbatches=2, world_size=2, recompute="full",
                                  recompute_num_layers=2, stages=stages(8)),
}


def plan_of(case: str) -> Plan:
    return Plan(**CASES[case])


def model_path(model: str) -> Path:
    return MODELS_DIR / f"{model}.py"
