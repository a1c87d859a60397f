"""How benchmarks/more_runs.py poses the rows of data/more_runs.csv, checked against what the
rows themselves state."""

import pytest
from more_runs import more_runs


@pytest.fixture(scope="module")
def posed():
    runs, skipped = more_runs()
    return {r.row_id: r for r in runs}, {s.row_id: s for s in skipped}


def test_llm_foundry_step_is_the_published_throughput_over_the_posed_batch(posed):
    # LLMF-H100L-01: MPT-70b, 512 H100, mbs 8, GA 1, DP 512, s 2048, 1007 tokens/s/GPU; the row's
    # own derived step_time_s is 16.2685 s = 8 * 512 * 2048 / (1007 * 512).
    run = posed[0]["LLMF-H100L-01"]
    assert run.global_batch == 8 * 1 * 512
    assert run.step_time_s == pytest.approx(16.2685, rel=1e-3)
    assert (run.runtime, run.gpu, run.attention) == ("fsdp", "h100-sxm5-80gb", "flash")
    assert run.pins == {"tp": 1, "pp": 1, "dp": 512, "mbs": 8, "vpp": 1, "recompute": "full",
                        "sp": False, "zero": 3}


def test_bigscience_rows_run_megatron_deepspeed_with_their_pipeline(posed):
    # BSPRQ-002: TP 8, PP 10, DP 1, MBS 1, GBS 2048, ZeRO-1, fp16, explicit attention, 844.81 s.
    run = posed[0]["BSPRQ-002"]
    assert (run.runtime, run.precision, run.attention) == ("deepspeed", "fp16", "explicit")
    assert (run.pins["tp"], run.pins["pp"], run.pins["dp"], run.pins["zero"]) == (8, 10, 1, 1)
    assert (run.global_batch, run.step_time_s) == (2048, 844.81)
    assert run.cluster["nodes"] == 10


def test_llm_foundry_fp8_rows_are_posed_as_fp8(posed):
    # LLMF-H100FP8-02: MPT-3b, amp_fp8, 8 H100, s 8192, mbs 3, GA 6, 19146 tokens/s/GPU:
    # step = 3 * 6 * 8 * 8192 / (19146 * 8) = 7.70 s
    run = posed[0]["LLMF-H100FP8-02"]
    assert (run.precision, run.runtime, run.gpu) == ("fp8", "fsdp", "h100-sxm5-80gb")
    assert run.step_time_s == pytest.approx(3 * 6 * 8 * 8192 / (19146 * 8), rel=1e-9)


def test_v100_rows_have_four_gpus_per_node(posed):
    run = posed[0]["BS1B3-22"]  # 8 V100 16GB on 2 nodes of 4, PP 4, DP 2
    assert (run.gpu, run.cluster["nodes"], run.cluster["gpus_per_node"]) == ("v100-sxm2-16gb", 2, 4)


def test_rows_that_cannot_be_posed_say_why(posed):
    runs, skipped = posed
    assert "outcome: oom" in skipped["BS1B3-24"].reason  # an OOM has no step time
    assert "not stated" in skipped["BSPRQ-007"].reason  # layers not stated
    # BSPRQ-044: 18B (L=6, h=14336) on 8 A100 at GBS 2048 x 2048 tokens in 130.43 s would be
    # 6 * 12 * 6 * 14336^2 * 4,194,304 / (8 * 130.43) = 357 TFLOP/s per GPU, above the A100's
    # 312 peak; the row's own 143.48 TFLOP/s fits the text's GBS 512.
    assert "peak" in skipped["BSPRQ-044"].reason
    assert "BSPRQ-043" not in skipped and "BSPRQ-047" not in skipped
    # Every row of the file is either posed or skipped: 390 rows (data/README.md).
    assert len(runs) + len(skipped) == 390


def test_bigscience_search_rows_launch_blocking_from_the_02_20_tables(posed):
    # chronicles-prequel.md: the 02-17 "Best TFLOPs" tables ran before the section that sets
    # CUDA_LAUNCH_BLOCKING=1 against the hangs; the 02-20 tables and later ran with it.
    runs = posed[0]
    assert "launch_blocking" not in runs["BSPRQ-002"].runtime_settings  # 02-17
    assert runs["BSPRQ-032"].runtime_settings["launch_blocking"] is True  # 02-21
    assert runs["BSPRQ-134"].runtime_settings["launch_blocking"] is True  # 02-28
    assert "launch_blocking" not in runs["BS1B3-01"].runtime_settings  # the 2021 V100 runs
