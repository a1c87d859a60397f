"""Compute time of one layer for one micro-batch on one GPU, after TP/CP splitting.

Each Linear is a GEMM of ``m = tokens`` rows, its columns (column-parallel) or rows
(row-parallel) divided by TP, running at an efficiency that grows with its size:
``eff = gemm_efficiency * f / (f + gemm_half_flops)`` for a GEMM of f FLOPs (small per-GPU GEMMs
are launch/tail-bound). Backward is two GEMMs of the same size (input and weight gradients).
Attention runs as the fused flash kernel (causal masks skip half the tiles) or, for runtimes
without it, as batched GEMMs plus a memory-bound softmax/dropout over the s x s scores.
Everything else is memory-bound: its traced bytes over HBM bandwidth.
"""

from __future__ import annotations

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


def _gemm_time(flops: float, peak: float, profile: ComputeProfile) -> float:
    if flops <= 0:
        return 0.0
    efficiency = profile.gemm_efficiency * flops / (flops + profile.gemm_half_flops)
    return flops / (peak * efficiency)


def gemm_times(layer: Layer, split: Split, peak: float, profile: ComputeProfile) -> float:
    """Forward time of the layer's Linears (and other matmul-like ops, unsplit) for one
    micro-batch."""
    total = _gemm_time(layer.other_fwd_flops * split.mbs, peak, profile)
    return total + sum(_linear_time(g, split, peak, profile) for g in layer.gemms)


def column_gemm_time(layer: Layer, split: Split, peak: float, profile: ComputeProfile) -> float:
    """Forward time of the layer's column-parallel Linears for one micro-batch."""
    return sum(_linear_time(g, split, peak, profile) for g in layer.gemms
               if g.split is TpSplit.COLUMN)


def _linear_time(gemm: Gemm, split: Split, peak: float, profile: ComputeProfile) -> float:
    n, k = gemm.out_features, gemm.in_features
    if gemm.split is TpSplit.COLUMN:
        n = n / split.tp
    elif gemm.split is TpSplit.ROW:
        k = k / split.tp
    rows = split.mbs * gemm.rows / split.cp
    return gemm.count * _gemm_time(2.0 * rows * n * k, peak, profile)


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
    gemm = gemm_times(layer, split, peak, profile)
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
                     column_gemm_s=column_gemm_time(layer, split, peak, profile),
                     attention_fwd_s=att_fwd, attention_bwd_s=att_bwd, wgrad_s=gemm)
