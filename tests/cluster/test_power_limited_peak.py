"""A GPU run below its rated power limit runs its tensor cores at a lower clock. Grand Teton's
H100 (torchtitan's H100 benchmark: 500 W) is priced between the two operating points NVIDIA's
H100 datasheet gives the same 132-SM die: expected values worked here from the datasheet."""

from __future__ import annotations

import pytest

from autoplan.cluster.catalog import get_gpu

FLOP_PER_CLOCK = 132 * 4 * 512 * 2
"""132 SMs x 4 tensor cores x 512 dense BF16 FMAs per clock x 2 FLOPs (H100 whitepaper)."""

SXM = (700.0, 989.4e12)  # H100 SXM: up to 700 W, 1,979 TFLOP/s BF16 with sparsity
NVL = (400.0, 835.5e12)  # H100 NVL: up to 400 W, 1,671 TFLOP/s BF16 with sparsity


def _clock_hz(point: tuple[float, float]) -> float:
    return point[1] / FLOP_PER_CLOCK


def test_the_datasheet_points_are_clocks_of_one_die():
    """989.4 TFLOP/s is 1830 MHz (NVIDIA's stated H100 SXM boost clock), 835.5 is 1545 MHz."""
    assert _clock_hz(SXM) == pytest.approx(1.830e9, rel=1e-3)
    assert _clock_hz(NVL) == pytest.approx(1.545e9, rel=1e-3)


def test_grand_teton_peak_lies_at_500_w_between_them():
    """Linear in power: 1545 + (1830 - 1545) x (500 - 400) / (700 - 400) = 1640 MHz, i.e.
    540,672 FLOP/clock x 1.640 GHz = 886.7 TFLOP/s; fp8 twice that."""
    watts = 500.0
    clock = _clock_hz(NVL) + (_clock_hz(SXM) - _clock_hz(NVL)) * (watts - NVL[0]) / (SXM[0] - NVL[0])
    gpu = get_gpu("h100-sxm5-96gb-hbm2e")
    assert gpu.peak_flops("bf16") == pytest.approx(FLOP_PER_CLOCK * clock, rel=2e-3)
    assert gpu.fp8_flops == pytest.approx(2 * FLOP_PER_CLOCK * clock, rel=2e-3)
    assert gpu.peak_flops("bf16") < get_gpu("h100-sxm5-80gb").peak_flops("bf16")
