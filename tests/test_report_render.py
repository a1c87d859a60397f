"""The plain-text reports of verify, infer and calibrate (report.py): each figure of the
document appears, in the unit and rounding the line states."""

from __future__ import annotations

import io

from rich.console import Console

from autoplan.calibrate import MeasuredProfile, fitted_profile
from autoplan.inference import InferencePlacement
from autoplan.report import render_inference, render_measured, render_verify


def _text(render, *args) -> str:
    buffer = io.StringIO()
    render(*args, Console(file=buffer, width=200, color_system=None))
    return buffer.getvalue()


def test_verify_report_has_each_step_each_rank_and_the_notes():
    document = {"losses_reference": [2.5, 2.25], "losses_parallel": [2.5, 2.2500001],
                "max_rel_loss_diff": 4.4e-8, "notes": ["tp looks fine"],
                "ranks": [{"rank": 0, "peak_bytes_measured": 3 * 2**20,
                           "peak_bytes_predicted": 3.5 * 2**20,
                           "peak_reserved_bytes_replayed": 4 * 2**20}]}
    text = _text(render_verify, document)
    assert "step 0: reference 2.500000  parallel 2.500000" in text
    assert "step 1: reference 2.250000  parallel 2.250000" in text  # 2.2500001 to 6 places
    assert "largest relative loss difference: 4.40e-08" in text
    # 3 MiB, 3.5 MiB, 4 MiB: the byte counts above divided by 2**20
    assert "rank 0: peak 3.00 MiB measured, 3.50 MiB predicted, 4.00 MiB as CUDA's" in text
    assert "note: tp looks fine" in text


def test_infer_report_lists_modules_per_gpu_and_the_token_time():
    placement = InferencePlacement(
        device_map={"emb": 0, "h.0": 0, "h.1": 1, "head": 1}, gpus_used=2,
        memory_per_gpu_gib=[1.26, 0.5], memory_limit_gib=2.0, time_per_token_s=0.0125,
        tokens_per_s=80.0)
    text = _text(render_inference, placement, 256, 1)
    title = " ".join(text.split("┏")[0].split())  # rich wraps the title to the table's width
    assert title == "device_map over 2 GPU(s), 256 tokens of context x batch 1"
    rows = [line for line in text.splitlines() if "emb" in line or "head" in line]
    assert "emb" in rows[0] and "h.0" in rows[0] and "1.3" in rows[0]  # 1.26 to one place
    assert "h.1" in rows[1] and "head" in rows[1] and "0.5" in rows[1]
    assert "time per generated token: 12.5 ms; 80.0 tokens/s (batch 1)" in text


def test_calibrate_report_states_the_fitted_efficiencies():
    measured = MeasuredProfile.model_validate({
        "device": "cpu", "device_name": "a CPU", "dtype": "float32", "peak_flops": 1e12,
        "reference_memory_bandwidth_Bps": 1e11,
        "gemm": [{"m": 256, "n": 256, "k": 256, "seconds": 256**3 * 2 / 5e11},
                 {"m": 1024, "n": 1024, "k": 1024, "seconds": 1024**3 * 2 / 8e11}],
        "memory": {"bytes": 2e9, "seconds": 0.1},
        "all_reduce": {"bytes": 1e9, "seconds": 0.5, "num_gpus": 4}})
    fitted = fitted_profile(measured)
    text = _text(render_measured, measured, fitted)
    assert "a CPU (float32), reference peak 1 TFLOP/s" in text
    assert f"gemm_efficiency {fitted.gemm_efficiency:.3f}" in text
    assert "(20 GB/s)" in text  # 2e9 bytes in 0.1 s
    # nccl-tests' bus bandwidth: 2 (n-1)/n * bytes / s = 2 * 3/4 * 1e9 / 0.5 = 3 GB/s
    assert "all-reduce over 4 GPUs: bus bandwidth 3 GB/s" in text
