"""Colossal-AI's 2D / 2.5D / 3D tensor parallelism against 1D (Megatron) TP: bytes each GPU
communicates per transformer layer per micro-batch (forward and backward).

These are TP variants, not "3D parallelism" (DP+TP+PP). Notation: ``n = b * s`` tokens of the
micro-batch, ``h`` hidden size, ``p`` GPUs of the TP group, every element ``e`` bytes (2 for
bf16/fp16). A transformer layer has four linears ``Y[n, k] = X[n, m] W[m, k]``: QKV ``(h, 3h)``,
attention output ``(h, h)``, MLP up ``(h, f)`` (``2f`` outputs when gated) and MLP down
``(f, h)``. Summed over them: ``Σnm`` input elements, ``Σmk`` weight elements, ``Σnk`` output
elements (for ``f = 4h``, ungated: ``7nh``, ``12h²``, ``9nh``). Attention scores are local in
every mode (heads and tokens are both split), and the layer-norm statistics all-reduces
(``O(n/q)`` numbers) are left out. Collectives cost what a ring costs each GPU: an all-reduce of
``N`` elements over ``g`` GPUs ``2(g-1)/g·N``, an all-gather or reduce-scatter ``(g-1)/g·N`` of
the full size, a SUMMA broadcast or reduce of one block per step.

- **1D, Megatron** (Shoeybi et al. 2019, sec. 3, fig. 3): ``p`` GPUs split the weights by
  column then by row; the layer's activations are replicated. Two all-reduces of ``n·h`` in
  the forward (after attention, after the MLP) and two in the backward (the ``f`` operators'
  gradients): ``V1 = 4 · 2(p-1)/p · n·h``. Weights never move.
- **2D, Optimus / SUMMA** (Xu, Li, Gong, You 2021, "An Efficient 2D Method for Training
  Super-Large Deep Learning Models", arXiv:2104.05343, sec. 3): ``p = q²`` on a ``q x q`` grid;
  activations and weights are both split in ``q x q`` blocks. Each matmul is a SUMMA of ``q``
  steps in which every GPU receives one block of each moving operand, ``q-1`` of them from
  others; forward moves X and W, the backward ``dX = dY·Wᵀ`` moves W and the partial dX,
  ``dW = Xᵀ·dY`` moves X and the partial dW: ``V2 = 3 · (q-1)/q² · (Σnm + Σmk)``.
- **2.5D, Tesseract** (Wang, Bian, Li, Wang, You 2021, "2.5-dimensional distributed model
  training", arXiv:2105.14500, sec. 3): ``p = d·q²``, ``d`` layers of a ``q x q`` grid; the
  tokens are split over ``d·q`` and each layer runs 2D SUMMA on its ``n/d`` tokens with the
  weights replicated over depth, whose gradients are then all-reduced over the ``d`` layers:
  ``V2.5 = 3 · (q-1)/q² · (Σnm/d + Σmk) + 2(d-1)/d · Σmk/q²``. With ``d = 1`` it is 2D.
- **3D** (Bian, Xu, Wang, You 2021, "Maximizing Parallelism in Distributed Training for Huge
  Neural Networks", arXiv:2105.14450, sec. 3): ``p = l³`` on an ``l x l x l`` cube. Forward:
  all-gather X and W blocks (each ``1/l²`` of the matrix) over ``l`` GPUs, reduce-scatter Y;
  backward: all-gather dY, reduce-scatter dX and dW (the gathered X and W are kept from the
  forward): ``V3 = 2 · (l-1)/l³ · (Σnm + Σmk + Σnk)``.

1D moves only activations, ``O(n·h)`` regardless of ``p``; the others move weights too but
shrink as ``1/√p`` (2D) or ``1/p^(2/3)`` (3D), so they win with many GPUs and many tokens per
micro-batch, and lose at small TP sizes with weights larger than the micro-batch's activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODES = ("1D", "2D", "2.5D", "3D")


@dataclass(frozen=True)
class LayerDims:
    """The operand sizes (elements) of one transformer layer's four linears, summed."""

    inputs: float   # Σ n·m
    weights: float  # Σ m·k
    outputs: float  # Σ n·k
    tokens_hidden: float  # n·h, the size Megatron all-reduces


def layer_dims(*, hidden: int, tokens: int, ffn: int | None = None,
               gated: bool = False) -> LayerDims:
    """Sums over QKV, attention output, MLP up and MLP down for ``tokens = b*s``."""
    h, n, f = hidden, tokens, ffn or 4 * hidden
    up = 2 * f if gated else f
    shapes = [(h, 3 * h), (h, h), (h, up), (f, h)]  # (in, out) of each linear
    return LayerDims(inputs=sum(n * m for m, _ in shapes), weights=sum(m * k for m, k in shapes),
                     outputs=sum(n * k for _, k in shapes), tokens_hidden=n * h)


def volume_1d(dims: LayerDims, p: int) -> float:
    """Elements per GPU: four ring all-reduces of n·h over p GPUs."""
    return 4 * 2 * (p - 1) / p * dims.tokens_hidden


def volume_2d(dims: LayerDims, q: int) -> float:
    """Elements per GPU on a q x q SUMMA grid (Optimus)."""
    return 3 * (q - 1) / q**2 * (dims.inputs + dims.weights)


def volume_2p5d(dims: LayerDims, q: int, d: int) -> float:
    """Elements per GPU on d layers of a q x q grid (Tesseract)."""
    return (3 * (q - 1) / q**2 * (dims.inputs / d + dims.weights)
            + 2 * (d - 1) / d * dims.weights / q**2)


def volume_3d(dims: LayerDims, l: int) -> float:
    """Elements per GPU on an l x l x l cube."""
    return 2 * (l - 1) / l**3 * (dims.inputs + dims.weights + dims.outputs)


@dataclass(frozen=True)
class ModeVolume:
    """One mode at the valid size nearest the asked TP size."""

    mode: str
    gpus: int
    shape: str  # "p=8", "q=2", "q=2 d=2", "l=2"
    bytes_per_gpu: float
    vs_1d: float  # bytes_per_gpu / what 1D moves on the same number of GPUs


def _nearest(candidates: list[tuple[int, float, str]], p: int) -> tuple[int, float, str]:
    """The candidate (gpus, elements, shape) nearest p GPUs; ties: the smaller, then less traffic."""
    return min(candidates, key=lambda c: (abs(c[0] - p), c[0], c[1]))


def compare_tp_modes(*, tp: int, hidden: int, tokens: int, ffn: int | None = None,
                     gated: bool = False, bytes_per_element: int = 2) -> list[ModeVolume]:
    """Per-GPU bytes per transformer layer per micro-batch of 1D, 2D, 2.5D and 3D TP near
    ``tp`` GPUs. 2D needs a square, 2.5D ``d·q²``, 3D a cube (q, l ≥ 2; d ≥ 1); each takes the valid size
    nearest ``tp`` (ties: the smaller), and 2.5D the (q, d) that communicates least there; ``vs_1d``
    compares with 1D on that many GPUs."""
    if tp < 1:
        raise ValueError(f"tp must be at least 1, not {tp}")
    dims = layer_dims(hidden=hidden, tokens=tokens, ffn=ffn, gated=gated)
    span = range(1, 4 * tp + 2)
    options = {
        "1D": [(tp, volume_1d(dims, tp), f"p={tp}")],
        "2D": [(q * q, volume_2d(dims, q), f"q={q}") for q in span[1:] if q * q <= 4 * tp],
        "2.5D": [(d * q * q, volume_2p5d(dims, q, d), f"q={q} d={d}")
                 for q in span[1:] for d in span if d * q * q <= 4 * tp],
        "3D": [(l**3, volume_3d(dims, l), f"l={l}") for l in span[1:] if l**3 <= 8 * tp],
    }
    out = []
    for mode in MODES:
        gpus, elements, shape = _nearest(options[mode], tp)
        base = volume_1d(dims, gpus)
        out.append(ModeVolume(mode, gpus, shape, elements * bytes_per_element,
                              elements / base if base else math.inf))
    return out
