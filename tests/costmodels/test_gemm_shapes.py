"""GEMM time from its shape: wave quantization on the GPU's SMs and the HBM roofline, checked
against hand-worked tile counts, the vendors' datasheet figures and XLA's measured H100 table."""

import csv
import math
from pathlib import Path

import pytest

from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import gemm_time, wave_efficiency
from autoplan.costmodels.profiles import compute_profile


def test_sm_counts_are_the_whitepaper_figures():
    # NVIDIA whitepapers: V100 80 SMs, A100 108, H100 SXM5 132; Ada: RTX 4090 128, L40S 142.
    assert {n: get_gpu(n).sm_count for n in ("v100-sxm2-32gb", "a100-sxm4-80gb",
                                              "h100-sxm5-80gb", "h200-sxm-141gb", "rtx-4090",
                                              "l40s")} == {
        "v100-sxm2-32gb": 80, "a100-sxm4-80gb": 108, "h100-sxm5-80gb": 132,
        "h200-sxm-141gb": 132, "rtx-4090": 128, "l40s": 142}


def test_one_tile_past_a_full_wave_costs_a_second_wave():
    # A100, 128x128 tiles: 1152 x 1536 is 9 x 12 = 108 tiles, one full wave of 108 SMs;
    # 1280 x 1536 is 10 x 12 = 120 tiles, two waves of which 120/216 = 5/9 is busy.
    assert wave_efficiency(1152, 1536, 108) == 1.0
    assert wave_efficiency(1280, 1536, 108) == pytest.approx(120 / 216)
    # The same shapes on H100 (132 SMs): 108/132 and 120/132 of one wave.
    assert wave_efficiency(1152, 1536, 132) == pytest.approx(108 / 132)
    assert wave_efficiency(1280, 1536, 132) == pytest.approx(120 / 132)


def test_second_wave_nearly_doubles_the_time_on_a100():
    # Compute-bound k = 8192: t = (f / wave + half) / (peak * eff), the start-up (half) once per
    # kernel. 1152 x 1536 fills one wave (f1 = 2*1152*1536*8192 = 29.0 GFLOP); 1280 x 1536 has
    # 10/9 the FLOPs in two waves, 5/9 busy, so it issues f2 * 9/5 = 2 * f1 FLOPs of wave time.
    gpu, profile = get_gpu("a100-sxm4-80gb"), compute_profile("a100-sxm4-80gb")
    peak = gpu.peak_flops("bf16")
    small = gemm_time(1152, 1536, 8192, gpu, peak, profile)
    large = gemm_time(1280, 1536, 8192, gpu, peak, profile)
    f1, half = 2 * 1152 * 1536 * 8192, profile.gemm_half_flops
    assert large / small == pytest.approx((2 * f1 + half) / (f1 + half))


def test_a_one_wave_gemm_takes_as_long_with_fewer_tiles():
    # 256 x 512 (2 x 4 = 8 tiles) and 512 x 512 (16 tiles) are each one partial wave on
    # A100's 108 SMs: every tile runs at once, so the smaller GEMM is not faster (half the
    # rows buys nothing until a wave is full).
    gpu, profile = get_gpu("a100-sxm4-80gb"), compute_profile("a100-sxm4-80gb")
    peak = gpu.peak_flops("bf16")
    assert gemm_time(256, 512, 4096, gpu, peak, profile) == pytest.approx(
        gemm_time(512, 512, 4096, gpu, peak, profile))


def test_thin_gemm_is_bound_by_hbm_bandwidth():
    # A decode-sized GEMM (m = 1 token) against an 8192 x 8192 bf16 weight on H100: it must
    # stream 2 * 8192^2 bytes of weight, 134 MB, which at the datasheet's 3.35 TB/s takes at
    # least 40 us, while its 134 MFLOPs would take 0.14 us at the 989 TFLOP/s peak.
    gpu, profile = get_gpu("h100-sxm5-80gb"), compute_profile("h100-sxm5-80gb")
    t = gemm_time(1, 8192, 8192, gpu, gpu.peak_flops("bf16"), profile)
    weight_bytes = 2 * 8192 * 8192
    assert t >= weight_bytes / 3.35e12
    assert t == pytest.approx(2 * (8192 * 8192 + 2 * 8192) / (3.35e12 * profile.memory_efficiency))


def test_a_large_square_gemm_is_compute_bound_near_the_plateau():
    # 8192^3 on A100: 1.1 TFLOP, arithmetic intensity 2*8192^3 / (3 * 2 * 8192^2) = 2731
    # FLOP/byte, far above A100's ridge of 312e12 / 2.039e12 = 153: compute-bound, 4096 tiles
    # = 37.9 waves of 108 (4096 / (38 * 108) busy), at the plateau gemm_efficiency.
    gpu, profile = get_gpu("a100-sxm4-80gb"), compute_profile("a100-sxm4-80gb")
    f = 2 * 8192**3
    t = gemm_time(8192, 8192, 8192, gpu, 312e12, profile)
    busy = 4096 / (math.ceil(4096 / 108) * 108)
    assert t == pytest.approx((f / busy + profile.gemm_half_flops) / (312e12 * profile.gemm_efficiency))


def test_h100_gemm_efficiency_carries_a100s_by_the_published_best_matmul():
    # stas00/ml-engineering, compute/accelerator "Maximum Achievable Matmul FLOPS comparison
    # table" (mamf-finder.py, BF16): A100 SXM 267.9 of 312 TFLOP/s, H100 SXM 792.1 of 989.
    a100, h100 = (compute_profile(g).gemm_efficiency for g in ("a100-sxm4-80gb", "h100-sxm5-80gb"))
    assert h100 / a100 == pytest.approx((792.1 / 989) / (267.9 / 312), rel=0.005)


XLA_H100 = Path(__file__).parents[1] / "data" / "gemm" / "xla_h100_bf16_matmul.csv"


def _xla_h100_rows() -> list[tuple[int, int, int, float]]:
    lines = [line for line in XLA_H100.read_text().splitlines() if not line.startswith("#")]
    return [(int(r["m"]), int(r["n"]), int(r["k"]), float(r["tflops"]))
            for r in csv.DictReader(lines)]


def test_h100_gemm_shapes_follow_xlas_measured_table_where_training_gemms_lie():
    # XLA's measured bf16 matmul table for sm_90 (tests/data/gemm/, with its commit): relative
    # to its 4096^3 GEMM, every GEMM of 1.7e10 FLOPs and more (a Linear of 1-4k tokens and a
    # few thousand features, what training runs) is within 8% of the measured relative speed.
    # The model's plateau efficiency is an end-to-end share, so only the shape is compared.
    gpu, profile = get_gpu("h100-sxm5-80gb"), compute_profile("h100-sxm5-80gb")

    def tflops(m: int, n: int, k: int) -> float:
        return 2 * m * n * k / gemm_time(m, n, k, gpu, gpu.bf16_flops, profile) / 1e12

    rows = _xla_h100_rows()
    reference = {(m, n, k): t for m, n, k, t in rows}[(4096, 4096, 4096)]
    large = [(m, n, k, t) for m, n, k, t in rows if 2 * m * n * k >= 1.7e10]
    assert len(large) == 7
    for m, n, k, measured in large:
        relative = tflops(m, n, k) / tflops(4096, 4096, 4096)
        assert relative == pytest.approx(measured / reference, rel=0.08), (m, n, k)
