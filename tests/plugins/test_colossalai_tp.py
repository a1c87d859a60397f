"""Per-GPU TP communication of 1D / 2D / 2.5D / 3D, against hand-worked numbers.

The case: h = 4, f = 4h = 16, n = b*s = 8 tokens, ungated. Summed over QKV (4->12), attention
output (4->4), MLP up (4->16), MLP down (16->4):
  inputs  Σnm = 8*(4+4+4+16)   = 224  (= 7nh)
  weights Σmk = 48+16+64+64    = 192  (= 12h²)
  outputs Σnk = 8*(12+4+16+4)  = 288  (= 9nh)
"""

import pytest

from autoplan.plugins.colossalai_tp import (compare_tp_modes, layer_dims, volume_1d, volume_2d,
                                            volume_2p5d, volume_3d)

DIMS = layer_dims(hidden=4, tokens=8)


def test_layer_sums():
    assert (DIMS.inputs, DIMS.weights, DIMS.outputs, DIMS.tokens_hidden) == (224, 192, 288, 32)


def test_1d_megatron_four_all_reduces():
    # 4 all-reduces of n*h = 32 over p = 4: 4 * 2*(3/4) * 32 = 192 elements.
    assert volume_1d(DIMS, 4) == pytest.approx(192)
    assert volume_1d(DIMS, 1) == 0


def test_2d_summa():
    # q = 2: 3 * (1/4) * (224 + 192) = 312 elements.
    assert volume_2d(DIMS, 2) == pytest.approx(312)


def test_2p5d_tesseract():
    # q = 2, d = 2: 3 * (1/4) * (224/2 + 192) + 2 * (1/2) * 192/4 = 228 + 48 = 276.
    assert volume_2p5d(DIMS, 2, 2) == pytest.approx(276)
    assert volume_2p5d(DIMS, 2, 1) == pytest.approx(volume_2d(DIMS, 2))  # d = 1 is 2D


def test_3d_cube():
    # l = 2: 2 * (1/8) * (224 + 192 + 288) = 176 elements.
    assert volume_3d(DIMS, 2) == pytest.approx(176)


def test_compare_at_tp8_in_bytes():
    rows = {r.mode: r for r in compare_tp_modes(tp=8, hidden=4, tokens=8)}
    assert (rows["1D"].gpus, rows["1D"].bytes_per_gpu) == (8, pytest.approx(2 * 224))  # 8*7/8*32
    assert (rows["2.5D"].gpus, rows["2.5D"].shape) == (8, "q=2 d=2")
    assert rows["2.5D"].bytes_per_gpu == pytest.approx(2 * 276)
    assert (rows["3D"].gpus, rows["3D"].bytes_per_gpu) == (8, pytest.approx(2 * 176))
    assert rows["3D"].vs_1d == pytest.approx(176 / 224)
    # 8 is not a square: 2D takes the nearest, 9 = 3x3: 3 * (2/9) * 416 elements.
    assert (rows["2D"].gpus, rows["2D"].shape) == (9, "q=3")
    assert rows["2D"].bytes_per_gpu == pytest.approx(2 * 3 * 2 / 9 * 416)
    assert rows["2D"].vs_1d == pytest.approx(3 * 2 / 9 * 416 / volume_1d(DIMS, 9))


def test_many_gpus_favour_2d_and_3d():
    """1D's traffic does not shrink with p; 2D's falls as 1/sqrt(p) and 3D's as 1/p^(2/3)."""
    rows = {r.mode: r for r in compare_tp_modes(tp=64, hidden=4, tokens=8)}
    assert rows["3D"].vs_1d < rows["2D"].vs_1d < 1
