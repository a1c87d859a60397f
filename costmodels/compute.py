"""Compute time of one layer for one micro-batch on one GPU, after TP/CP splitting.

Each Linear is a GEMM of ``m = tokens`` rows, its columns (column-parallel) or rows
(row-parallel) divided by TP, costed from its shape (:func:`gemm_time`): the output is cut into
GEMM_TILE tiles that run in waves of one per SM, so a last partial wave idles the rest of the
GPU (wave quantization); on top, ``gemm_efficiency * f / (f + gemm_half_flops)`` for a GEMM of f
FLOPs (launch and k-loop prologue of small GEMMs); and no GEMM runs faster than its operands
stream through HBM (roofline: thin GEMMs under large TP, LoRA adapters, decode). Backward is two
GEMMs of the same size (input and weight gradients).
Attention runs as the fused flash kernel (causal masks skip half the tiles) or, for runtimes
without it, as batched GEMMs plus a memory-bound softmax/dropout over the s x s scores.
Everything else is memory-bound: its traced bytes over HBM bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cluster.catalog import GpuSpec
from autoplan.costmodels.profiles import ComputeProfile
from autoplan.graph.layer_graph import Gemm, Layer, LayerKind, TpSplit
from autoplan.plan import Recompute

BACKWARD_TRAFFIC_FACTOR = 2.0
"""Element-wise backward kernels read the saved input and the output gradient and write the
input gradient: about twice the forward traffic."""

EXPLICIT_SCORE_BYTES = 9.0
"""Bytes moved per attention-score element in the forward of unfused-flash attention with
dropout: fused scale-mask-softmax reads 2 and writes 2, dropout reads 2, writes 2 and a 1-byte
mask (Megatron's fused kernels; Korthikanti et al. 2022 sec. 4.1 lists the same tensors)."""

EXPLICIT_SCORE_BYTES_NO_DROPOUT = 4.0
FLASH_CAUSAL_WORK = 0.5
"""Causal flash attention skips the tiles above the diagonal (Dao 2023)."""


@dataclass(frozen=True, slots=True)
class Split:
    """How a micro-batch is divided across GPUs for compute."""

    tp: int
    cp: int
    sp: bool
    mbs: int
    flash: bool = True


@dataclass(frozen=True, slots=True)
class LayerTime:
    """Seconds for one micro-batch: forward, backward, the backward's recompute, and the forward
    time of the column-parallel Linears (each of their input- and weight-gradient GEMMs takes as
    long: the window in which their TP gradient collectives can hide)."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    column_gemm_s: float
    attention_fwd_s: float
    attention_bwd_s: float = 0.0
    wgrad_s: float = 0.0  # weight-gradient GEMMs of backward (as long as the forward GEMMs)


GEMM_TILE = (128, 128)
"""Output tile (rows x columns) of one thread block of the 16-bit tensor-core GEMMs. CUTLASS's
default for sm80 is 128x256 (``default_gemm_configuration.h``) and libraries pick among 128x128
and larger tiles by shape; the smallest of these is taken, so the quantization modelled is the
least a real kernel has."""

GEMM_OPERAND_BYTES = 2
"""16-bit operands and output (bf16/fp16 training)."""


def wave_efficiency(m: float, n: float, sm_count: int | None) -> float:
    """Share of the GPU's SMs busy over a GEMM's waves: ``tiles / (waves * SMs)`` for
    ``ceil(m/128) * ceil(n/128)`` tiles, each SM running one tile at a time (NVIDIA Deep
    Learning Performance Guide, "Matrix Multiplication Background", wave quantization: one tile
    more than a multiple of the SM count costs a whole extra wave). 1 where the SM count is
    unknown."""
    if not sm_count:
        return 1.0
    tiles = math.ceil(m / GEMM_TILE[0]) * math.ceil(n / GEMM_TILE[1])
    return tiles / (math.ceil(tiles / sm_count) * sm_count)


def gemm_time(m: float, n: float, k: float, gpu: GpuSpec, peak: float,
              profile: ComputeProfile) -> float:
    """Seconds of one (m x k) @ (k x n) GEMM: tensor-core time at the wave-quantized, size-
    dependent efficiency, or the time its operands and output take through HBM, whichever is
    longer."""
    flops = 2.0 * m * n * k
    if flops <= 0:
        return 0.0
    compute = _flops_time(flops, peak, profile) / wave_efficiency(m, n, gpu.sm_count)
    traffic = GEMM_OPERAND_BYTES * (m * k + k * n + m * n)
    return max(compute, traffic / (gpu.memory_bandwidth_Bps * profile.memory_efficiency))


def _flops_time(flops: float, peak: float, profile: ComputeProfile) -> float:
    if flops <= 0:
        return 0.0
    efficiency = profile.gemm_efficiency * flops / (flops + profile.gemm_half_flops)
    return flops / (peak * efficiency)


def gemm_times(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
               profile: ComputeProfile) -> float:
    """Forward time of the layer's Linears (and other matmul-like ops, unsplit, whose shapes
    the trace does not keep) for one micro-batch."""
    total = _flops_time(layer.other_fwd_flops * split.mbs, peak, profile)
    return total + sum(_linear_time(g, split, gpu, peak, profile) for g in layer.gemms)


def column_gemm_time(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
                     profile: ComputeProfile) -> float:
    """Forward time of the layer's column-parallel Linears for one micro-batch."""
    return sum(_linear_time(g, split, gpu, peak, profile) for g in layer.gemms
               if g.split is TpSplit.COLUMN)


def _linear_time(gemm: Gemm, split: Split, gpu: GpuSpec, peak: float,
                 profile: ComputeProfile) -> float:
    n, k = gemm.out_features, gemm.in_features
    if gemm.split is TpSplit.COLUMN:
        n = n / split.tp
    elif gemm.split is TpSplit.ROW:
        k = k / split.tp
    rows = split.mbs * gemm.rows / split.cp
    return gemm.count * gemm_time(rows, n, k, gpu, peak, profile)


def attention_time(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
                   profile: ComputeProfile) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's attention calls for one micro-batch."""
    fwd = bwd = 0.0
    for att in layer.attention:
        shard = split.mbs / (split.tp * split.cp)
        if split.flash:
            work = FLASH_CAUSAL_WORK if att.causal else 1.0
            rate = peak * profile.attention_efficiency
            fwd += att.fwd_flops * shard * work / rate
            bwd += att.bwd_flops * shard * work / rate
            continue
        rate = peak * profile.bmm_efficiency
        elements = att.num_heads * att.seq_len * att.seq_len * shard / split.cp
        per_element = EXPLICIT_SCORE_BYTES if att.dropout > 0 else EXPLICIT_SCORE_BYTES_NO_DROPOUT
        traffic = elements * per_element / gpu.memory_bandwidth_Bps / profile.memory_efficiency
        fwd += att.fwd_flops * shard / rate + traffic
        bwd += 2 * att.fwd_flops * shard / rate + BACKWARD_TRAFFIC_FACTOR * traffic
    return fwd, bwd


def elementwise_time(layer: Layer, split: Split, gpu: GpuSpec, profile: ComputeProfile) -> float:
    """Forward time of the memory-bound ops (norms, activations, dropout, residual adds)."""
    replicated_div = split.tp if split.sp else 1
    traffic = layer.elementwise_bytes_sharded / split.tp + layer.elementwise_bytes_replicated / replicated_div
    return traffic * split.mbs / split.cp / (gpu.memory_bandwidth_Bps * profile.memory_efficiency)


def layer_time(layer: Layer, split: Split, recompute: Recompute, *, gpu: GpuSpec, precision: str,
               profile: ComputeProfile) -> LayerTime:
    """Compute time of one layer for one micro-batch (no communication)."""
    peak = gpu.peak_flops(precision)
    gemm = gemm_times(layer, split, gpu, peak, profile)
    att_fwd, att_bwd = attention_time(layer, split, gpu, peak, profile)
    other = elementwise_time(layer, split, gpu, profile)
    overhead = profile.kernel_overhead_s if layer.gemms or layer.attention else 0.0
    fwd = gemm + att_fwd + other + overhead
    bwd = 2 * gemm + att_bwd + BACKWARD_TRAFFIC_FACTOR * other + 2 * overhead
    recomputed = 0.0
    if layer.kind is LayerKind.BLOCK and recompute is Recompute.FULL:
        recomputed = fwd
    elif recompute is Recompute.SELECTIVE:
        recomputed = att_fwd
    return LayerTime(fwd_s=fwd, bwd_s=bwd, recompute_s=recomputed,
                     column_gemm_s=column_gemm_time(layer, split, gpu, peak, profile),
                     attention_fwd_s=att_fwd, attention_bwd_s=att_bwd, wgrad_s=gemm)
