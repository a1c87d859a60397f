"""Compute time of one layer for one micro-batch on one GPU, after TP/CP splitting.

Each Linear is a GEMM of ``m = tokens`` rows, its columns (column-parallel) or rows
(row-parallel) divided by TP, costed from its shape (:func:`gemm_time`): the output is cut into
GEMM_TILE tiles that run in waves of one per SM, so a last partial wave idles the rest of the
GPU (wave quantization); each kernel adds a fixed start-up of ``gemm_half_flops`` at the plateau
rate (launch, k-loop prologue: ``gemm_efficiency * f / (f + gemm_half_flops)`` for a GEMM of f
FLOPs that fills its waves); and no GEMM runs faster than its operands
stream through HBM (roofline: thin GEMMs under large TP, LoRA adapters of rank r, decode).
Backward is two GEMMs of the same size (input and weight gradients), each run only where
needed: a frozen Linear's weight gets no gradient, a Linear whose input needs none (below the
first trainable parameter) computes no input gradient, and a layer before the first trainable
parameter has no backward at all. Frozen weights stored quantized are dequantized before each
use (quantization.py).
Attention runs as the runtime's fused kernel (flash-attn 2, cuDNN, flash-attn 3, or Triton
FlashAttention at a stated share of flash-attn 2: :data:`RELATIVE_KERNELS`) at the speed
its authors published for that GPU and sequence length (:func:`attention_rate`; on a GPU without
such a table, at one efficiency over the 128-token score tiles it computes, a causal mask
skipping those above the diagonal: :func:`flash_work`), at its padded head dimension, or, for
runtimes without it, as batched GEMMs plus a memory-bound softmax/dropout over the s x s scores
(Megatron's fused softmax, or its eager fp32 fallback where the kernel's check refuses the
shape: costmodels.fused_softmax).
Everything else is memory-bound: its traced bytes over HBM bandwidth, each op a kernel of its
own as eager PyTorch runs it (the trace counts them as PyTorch dispatches them, fp32 upcasts
included; backward about twice the forward: benchmarks/compiled_traffic.py measures 2.09 for
torchtitan's Llama block). A runtime that compiles its blocks (torchtitan with torch.compile)
fuses them, and its kernels move the measured share of that traffic
(``compiled_elementwise_fraction``, :func:`fused_fraction`); Megatron runs its own fused
kernels, whose bytes come from a named table per ``--transformer-impl``
(costmodels.fused_kernels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoplan.cluster.catalog import GpuSpec
from autoplan.costmodels.fp8 import (LinearRate, cast_bytes, cast_times, linear_rate, norm_fed,
                                     runs_fp8)
from autoplan.costmodels.fused_kernels import BlockTraffic
from autoplan.costmodels.fused_softmax import (EAGER_BACKWARD_BYTES, EAGER_FORWARD_BYTES,
                                               FUSED_FORWARD_BYTES, runs_fused)
from autoplan.costmodels.profiles import ComputeProfile, RuntimeProfile
from autoplan.costmodels.quantization import HALF_BYTES, quantized_gemms, stored_bytes_per_param
from autoplan.graph.layer_graph import Attention, Gemm, Layer, LayerKind, TpSplit
from autoplan.plan import Plan, Recompute
from autoplan.records import kept_hash
from autoplan.training import FrozenDtype

BACKWARD_TRAFFIC_FACTOR = 2.0
"""Element-wise backward kernels read the saved input and the output gradient and write the
input gradient: about twice the forward traffic."""

EXPLICIT_SCORE_BYTES = 9.0
"""Bytes moved per attention-score element in the forward of unfused-flash attention with
dropout: fused scale-mask-softmax reads 2 and writes 2, dropout reads 2, writes 2 and a 1-byte
mask (Megatron's fused kernels; Korthikanti et al. 2022 sec. 4.1 lists the same tensors)."""

EXPLICIT_SCORE_BYTES_NO_DROPOUT = 4.0
FLASH_BLOCK = 128
"""Rows and columns of the score tile one flash-attention thread block computes at a time:
flash-attn 2 pads the sequence to multiples of 128 (``seqlen_q_rounded = round_multiple(
seqlen_q, 128)`` in csrc/flash_attn/flash_api.cpp) and its kernels walk 128-row blocks of Q."""


def flash_head_dim(head_dim: int) -> int:
    """The head dimension the flash kernel runs for ``head_dim``: flash-attn 2 dispatches
    kernels for multiples of 32 up to 192 and 256 above (flash_api.cpp:
    ``head_size <= 192 ? round_multiple(head_size, 32) : 256``), so a head of 80 costs a
    96-wide kernel."""
    if head_dim <= 192:
        return -(-head_dim // 32) * 32
    return max(256, head_dim)


def flash_work(seq_len: int, head_dim: int, causal: bool) -> float:
    """Work of one flash-attention call relative to its dense ``4 s^2 d`` FLOPs: the score
    tiles it computes (``ceil(s/128)`` blocks a side; a causal mask skips only the blocks
    wholly above the diagonal, so the diagonal blocks run whole: ``nb (nb + 1) / 2`` of
    ``nb^2``, 0.625 at 512 tokens, 0.504 at 64k) times the padded head dimension."""
    if seq_len <= 0 or head_dim <= 0:
        return 0.0
    blocks = -(-seq_len // FLASH_BLOCK)
    tiles = blocks * (blocks + 1) / 2 if causal else blocks**2
    area = tiles * FLASH_BLOCK**2 / seq_len**2
    return area * flash_head_dim(head_dim) / head_dim


REFERENCE_KERNEL = "flash2"
"""The kernel whose causal forward plateau a GPU's ``attention_efficiency`` states."""

RELATIVE_KERNELS = {"triton": (REFERENCE_KERNEL, 0.5)}
"""Kernels without a benchmark table of their own, priced at a share of another kernel's rate
on every GPU. ``triton``: Tri Dao's Triton FlashAttention (flash_attn_triton.py, copied as
llm-foundry's ``attn_impl: triton``, built with triton-pre-mlir), whose docstring states that
its "forward + backward is slightly slower than" FlashAttention (1)'s CUDA kernels, which
FlashAttention-2 runs "around 2x" faster (Dao 2023, abstract): half flash-attn 2's rate. The
same paper (sec. 4.1) has FlashAttention-2 "1.3-1.5x faster than FlashAttention in Triton in
the forward pass and around 2x faster in the backward pass" (the Triton tutorial kernel it grew
from): 0.55 of flash-attn 2's rate over a forward and its 2.5x backward. Like flash-attn 2 it
skips the score tiles wholly above the causal diagonal (``end_n``/``begin_m`` in its kernels),
so causal work is counted alike."""


def kernel_rate_share(kernel: str) -> tuple[str, float]:
    """(the kernel whose published rates price ``kernel``, the share of them it runs at)."""
    return RELATIVE_KERNELS.get(kernel, (kernel, 1.0))


def _interpolated(points: tuple, seq_len: float) -> float:
    """A published rate at ``seq_len``: linear in log2 of the length between the benchmarked
    lengths, the nearest end outside them (the tables plateau by their longest length)."""
    if seq_len <= points[0][0]:
        return points[0][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if seq_len <= s1:
            w = math.log2(seq_len / s0) / math.log2(s1 / s0)
            return r0 + w * (r1 - r0)
    return points[-1][1]


def _table_scale(profile: ComputeProfile, peak: float) -> float:
    """FLOP/s per published TFLOP/s: 1e12 where ``attention_efficiency`` is the reference
    kernel's causal forward plateau as profiles.yaml states it, in proportion otherwise."""
    plateau = next(points for k, d, points in profile.attention_kernels
                   if (k, d) == (REFERENCE_KERNEL, "causal_fwd"))[-1][1]
    return profile.attention_efficiency * peak / plateau


def attention_rate(profile: ComputeProfile, peak: float, kernel: str, seq_len: float,
                   causal: bool) -> tuple[float, float] | None:
    """(forward, backward) FLOP/s of the fused attention ``kernel`` at ``seq_len`` from the
    GPU's published table, causal FLOPs counted as half the dense ones; None where the GPU has
    no table for it. The published backward has no causal mask: a causal backward is taken to
    lose what the causal forward loses against the unmasked one at that length (the same
    tiles skipped, the same imbalance of the diagonal blocks). Scaled by ``attention_efficiency``
    against the reference kernel's causal forward plateau, so a calibration moves every
    kernel alike."""
    table = {(k, d): points for k, d, points in profile.attention_kernels}
    kernel, share = kernel_rate_share(kernel)
    if (kernel, "causal_fwd") not in table:
        return None
    scale = _table_scale(profile, peak) * share
    causal_fwd, fwd, bwd = (_interpolated(table[(kernel, d)], seq_len) * scale
                            for d in ("causal_fwd", "fwd", "bwd"))
    if not causal:
        return fwd, bwd
    return causal_fwd, bwd * causal_fwd / fwd


def best_attention_fraction(profile: ComputeProfile, peak: float, kernel: str) -> float:
    """The largest share of peak any attention call reaches counted in dense FLOPs (a causal
    one does half of them, so up to twice its kernel rate): what a lower bound on step time
    may assume of attention."""
    kernel, share = kernel_rate_share(kernel)
    rates = [r for k, _, points in profile.attention_kernels if k == kernel for _, r in points]
    if not rates:
        return 2 * profile.attention_efficiency * share
    return 2 * max(rates) * _table_scale(profile, peak) * share / peak


@dataclass(frozen=True, slots=True)
class Split:
    """How a micro-batch is divided across GPUs for compute (``kernel``: the runtime's fused
    attention kernel, costmodels.profiles.RuntimeProfile.attention_kernel; ``softmax_check``:
    which check picks explicit attention's fused softmax, costmodels.fused_softmax)."""

    tp: int
    cp: int
    sp: bool
    mbs: int
    flash: bool = True
    kernel: str = REFERENCE_KERNEL
    softmax_check: str | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return kept_hash(self)

    @classmethod
    def of(cls, plan: Plan, flash: bool, runtime: RuntimeProfile) -> "Split":
        """How ``plan`` divides each micro-batch (``flash``: the problem's attention kernel)
        under ``runtime``'s attention kernel and softmax check."""
        return cls(tp=plan.tp, cp=plan.cp, sp=plan.sequence_parallel, mbs=plan.micro_batch_size,
                   flash=flash, kernel=runtime.attention_kernel,
                   softmax_check=runtime.fused_softmax_check)

    def softmax_fused(self, att: Attention) -> bool:
        """Whether explicit attention ``att`` runs the fused softmax kernel on each GPU."""
        return runs_fused(self.softmax_check, self.mbs, att.num_heads // self.tp, att.seq_len)


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
              profile: ComputeProfile, *, operand_bytes: float = HALF_BYTES) -> float:
    """Seconds of one (m x k) @ (k x n) GEMM: its waves of tiles at the plateau efficiency
    plus a fixed start-up of ``gemm_half_flops`` worth of plateau time (launch, k-loop prologue
    and epilogue: the same ``f / (f + half)`` curve as :func:`_flops_time` for a GEMM that fills
    its waves), or the time its operands (``operand_bytes`` an element: 1 for FP8) and 16-bit
    output take through HBM, whichever is longer. The start-up is not divided by the wave
    share: it is paid once per kernel, however few tiles it has."""
    flops = 2.0 * m * n * k
    if flops <= 0:
        return 0.0
    issued = flops / wave_efficiency(m, n, gpu.sm_count)  # the idle SMs of the last wave count
    compute = (issued + profile.gemm_half_flops) / (peak * profile.gemm_efficiency)
    traffic = operand_bytes * (m * k + k * n) + HALF_BYTES * m * n
    return max(compute, traffic / (gpu.memory_bandwidth_Bps * profile.memory_efficiency))


def _flops_time(flops: float, peak: float, profile: ComputeProfile) -> float:
    """Seconds of a matmul known only by its FLOPs, at the size-dependent efficiency."""
    if flops <= 0:
        return 0.0
    efficiency = profile.gemm_efficiency * flops / (flops + profile.gemm_half_flops)
    return flops / (peak * efficiency)


def column_gemm_time(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
                     profile: ComputeProfile, *, operand_bytes: float = HALF_BYTES) -> float:
    """Forward time of the layer's column-parallel Linears for one micro-batch."""
    return sum(linear_time(g, split, gpu, peak, profile, operand_bytes) for g in layer.gemms
               if g.split is TpSplit.COLUMN)


def local_shape(gemm: Gemm, split: Split) -> tuple[float, float, float]:
    """(rows, k, n) of one application of the Linear on one GPU."""
    n, k = gemm.out_features, gemm.in_features
    if gemm.split is TpSplit.COLUMN:
        n = n / split.tp
    elif gemm.split is TpSplit.ROW:
        k = k / split.tp
    return split.mbs * gemm.rows / split.cp, k, n


def linear_time(gemm: Gemm, split: Split, gpu: GpuSpec, peak: float,
                profile: ComputeProfile, operand_bytes: float = HALF_BYTES) -> float:
    """Forward seconds of one Linear on one GPU for one micro-batch (each of its backward
    GEMMs as long)."""
    rows, k, n = local_shape(gemm, split)
    return gemm.count * gemm_time(rows, n, k, gpu, peak, profile, operand_bytes=operand_bytes)


def _backward_gemm_times(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
                         profile: ComputeProfile, linear: LinearRate
                         ) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of the layer's Linears (at
    ``linear``, fp8.linear_rate) and other matmuls (at ``peak``) for one micro-batch; each
    backward GEMM of a Linear the size of its forward, at the backward rate."""
    fwd = _flops_time(layer.other_fwd_flops * split.mbs, peak, profile)  # convs, bare matmuls
    dgrad = wgrad = fwd if layer.in_backward else 0.0
    for gemm in layer.gemms:
        fwd += linear_time(gemm, split, gpu, linear.forward_peak, profile, linear.operand_bytes)
        if gemm.dgrad or gemm.wgrad:
            t = linear_time(gemm, split, gpu, linear.backward_peak, profile,
                            linear.operand_bytes)
            dgrad += t if gemm.dgrad else 0.0
            wgrad += t if gemm.wgrad else 0.0
    return fwd, dgrad, wgrad


def dequantize_time(layer: Layer, split: Split, gpu: GpuSpec, profile: ComputeProfile,
                    frozen_dtype: FrozenDtype) -> tuple[float, float]:
    """(forward, backward) seconds of dequantizing the layer's quantized frozen weights for
    one micro-batch: read the stored weight, write a 2-byte copy, at every application (and
    again in backward where the input gradient needs the weight)."""
    if frozen_dtype not in (FrozenDtype.NF4, FrozenDtype.INT8):
        return 0.0, 0.0
    rate = gpu.memory_bandwidth_Bps * profile.memory_efficiency
    fwd = bwd = 0.0
    for gemm in quantized_gemms(layer):
        params = gemm.weight_params / (split.tp if gemm.split is not TpSplit.NONE else 1)
        seconds = gemm.count * params * (stored_bytes_per_param(frozen_dtype, gemm.in_features)
                                         + HALF_BYTES) / rate
        fwd += seconds
        bwd += seconds if gemm.dgrad else 0.0
    return fwd, bwd


def _flash_times(att: Attention, split: Split, peak: float,
                 profile: ComputeProfile) -> tuple[float, float]:
    """(forward, backward) seconds of one sample's fused attention call: at the kernel's
    published rate for the length each GPU's chunk has (``seq_len / cp``) where the GPU has a
    table (the dense FLOPs, halved when causal, at the padded head dimension), else at
    ``attention_efficiency`` of peak over the tiles it computes (:func:`flash_work`)."""
    rates = attention_rate(profile, peak, split.kernel, att.seq_len / split.cp, att.causal)
    if rates is None:
        work = flash_work(att.seq_len, att.head_dim, att.causal)
        rate = peak * profile.attention_efficiency * kernel_rate_share(split.kernel)[1]
        return att.fwd_flops * work / rate, att.bwd_flops * work / rate
    work = (0.5 if att.causal else 1.0) * flash_head_dim(att.head_dim) / att.head_dim
    return att.fwd_flops * work / rates[0], att.bwd_flops * work / rates[1]


def attention_time(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
                   profile: ComputeProfile) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's attention calls for one micro-batch."""
    fwd = bwd = 0.0
    for att in layer.attention:
        shard = split.mbs / (split.tp * split.cp)
        if split.flash:
            fwd_s, bwd_s = _flash_times(att, split, peak, profile)
            fwd += fwd_s * shard
            bwd += bwd_s * shard
            continue
        rate = peak * profile.bmm_efficiency
        elements = att.num_heads * att.seq_len * att.seq_len * shard / split.cp
        fwd_bytes, bwd_bytes = _score_traffic_per_element(att, split)
        seconds_per_byte = elements / gpu.memory_bandwidth_Bps / profile.memory_efficiency
        fwd += att.fwd_flops * shard / rate + fwd_bytes * seconds_per_byte
        bwd += 2 * att.fwd_flops * shard / rate + bwd_bytes * seconds_per_byte
    return fwd, bwd


def _score_traffic_per_element(att: Attention, split: Split) -> tuple[float, float]:
    """(forward, backward) HBM bytes per score element of explicit attention: Megatron's fused
    softmax and the dropout (:data:`EXPLICIT_SCORE_BYTES`), backward twice that; where the
    fused softmax does not run, its eager fp32 fallback instead (costmodels.fused_softmax)."""
    per_element = EXPLICIT_SCORE_BYTES if att.dropout > 0 else EXPLICIT_SCORE_BYTES_NO_DROPOUT
    fwd, bwd = per_element, BACKWARD_TRAFFIC_FACTOR * per_element
    if split.softmax_fused(att):
        return fwd, bwd
    return (fwd - FUSED_FORWARD_BYTES + EAGER_FORWARD_BYTES,
            bwd - BACKWARD_TRAFFIC_FACTOR * FUSED_FORWARD_BYTES + EAGER_BACKWARD_BYTES)


def traffic_time(sharded: float, replicated: float, split: Split, gpu: GpuSpec,
                 profile: ComputeProfile) -> float:
    """Seconds of memory-bound kernels moving these bytes per sample (``sharded`` split by TP,
    ``replicated`` only under SP) for one micro-batch."""
    replicated_div = split.tp if split.sp else 1
    traffic = sharded / split.tp + replicated / replicated_div
    return traffic * split.mbs / split.cp / (gpu.memory_bandwidth_Bps * profile.memory_efficiency)


def elementwise_time(layer: Layer, split: Split, gpu: GpuSpec, profile: ComputeProfile,
                     fused_fraction: float = 1.0) -> float:
    """Forward time of the memory-bound ops (norms, activations, dropout, residual adds), each
    a kernel of its own as eager PyTorch runs them (the traced bytes); ``fused_fraction``: the
    share of that traffic left where a compiler fuses them (torch.compile of the block,
    :func:`fused_fraction`)."""
    return traffic_time(layer.elementwise_bytes_sharded * fused_fraction,
                        layer.elementwise_bytes_replicated * fused_fraction, split, gpu, profile)


def elementwise_times(layer: Layer, split: Split, gpu: GpuSpec, profile: ComputeProfile,
                      fused: float, kernels: BlockTraffic | None) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's element-wise kernels: from the runtime's
    table of fused kernels where it has one for the layer (``kernels``,
    costmodels.fused_kernels), else the traced eager traffic (backward about twice it)."""
    if kernels is None:
        other = elementwise_time(layer, split, gpu, profile, fused)
        return other, BACKWARD_TRAFFIC_FACTOR * other
    return (traffic_time(kernels.fwd_sharded, kernels.fwd_replicated, split, gpu, profile),
            traffic_time(kernels.bwd_sharded, kernels.bwd_replicated, split, gpu, profile))


def fused_fraction(layer: Layer, compiled_fraction: float | None) -> float:
    """Share of a layer's eager element-wise traffic its kernels move: ``compiled_fraction``
    (the runtime's ``compiled_elementwise_fraction``) for a block where the runtime compiles
    blocks (torchtitan's ``torch.compile`` of each TransformerBlock, the loss and output layer
    left eager), else all of it."""
    if compiled_fraction is None or layer.kind is not LayerKind.BLOCK:
        return 1.0
    return compiled_fraction


def op_sac_recompute_time(layer: Layer, split: Split, gpu: GpuSpec, peak: float,
                          profile: ComputeProfile, fused: float = 1.0, *,
                          operand_bytes: float = HALF_BYTES) -> float:
    """What torchtitan's op-level selective checkpointing recomputes of a block in backward
    (torchtitan/distributed/activation_checkpoint.py, SelectiveAC ``_get_custom_policy``): the
    ops outside its save list (norms, activations, rotary, residual adds: PREFER_RECOMPUTE) and
    every second matmul of the block in forward order (``mm_count % 2 == 0``); attention, in
    the save list, is not rerun."""
    matmuls, index = 0.0, 0
    for gemm in layer.gemms:
        rows, k, n = local_shape(gemm, split)
        for _ in range(gemm.count):
            index += 1
            matmuls += (gemm_time(rows, n, k, gpu, peak, profile, operand_bytes=operand_bytes)
                        if index % 2 == 0 else 0.0)
    return matmuls + elementwise_time(layer, split, gpu, profile, fused)


def fp8_cast_times(layer: Layer, split: Split, gpu: GpuSpec, profile: ComputeProfile, *,
                   precision: str, casts_weights: bool, te_layers: bool) -> tuple[float, float]:
    """(forward, backward) seconds of Transformer Engine's FP8 casts of the layer for one
    micro-batch (costmodels.fp8); none outside FP8 blocks. ``te_layers``: the runtime's block
    is TE's own (LayerNormLinear: the norm writes its Linears' FP8 input)."""
    if not runs_fp8(layer, precision):
        return 0.0, 0.0
    shapes = [(g, *local_shape(g, split)) for g in layer.gemms]
    fused = norm_fed(layer.gemms) if te_layers else set()
    fwd, bwd = cast_bytes(shapes, tp=split.tp, casts_weights=casts_weights,
                          fused_norm_inputs=fused)
    return cast_times(fwd, bwd, gpu, profile)


def layer_time(layer: Layer, split: Split, recompute: Recompute, *, gpu: GpuSpec, precision: str,
               profile: ComputeProfile, frozen_dtype: FrozenDtype | None = None,
               op_sac: bool = False, compiled_fraction: float | None = None,
               kernels: BlockTraffic | None = None, casts_fp8_weights: bool = True) -> LayerTime:
    """Compute time of one layer for one micro-batch (no communication); ``frozen_dtype``:
    the storage of its frozen Linear weights (quantized ones are dequantized at each use);
    ``op_sac``: selective recompute is torchtitan's op-level policy, not Megatron's
    recompute of core attention; ``compiled_fraction``: the runtime compiles its blocks and
    their fused kernels move this share of the eager element-wise traffic (None: eager);
    ``kernels``: the layer's element-wise traffic from its runtime's fused-kernel table;
    ``casts_fp8_weights``: under FP8, each micro-batch casts the weights (no TE workspace
    cache; costmodels.fp8)."""
    peak = gpu.peak_flops(precision)
    linear = linear_rate(layer, gpu, precision, profile)
    gemm, dgrad, wgrad = _backward_gemm_times(layer, split, gpu, peak, profile, linear)
    att_fwd, att_bwd = attention_time(layer, split, gpu, peak, profile)
    att_bwd = att_bwd if any(a.backward for a in layer.attention) else 0.0
    deq_fwd, deq_bwd = (dequantize_time(layer, split, gpu, profile, frozen_dtype)
                        if frozen_dtype is not None else (0.0, 0.0))
    fused = fused_fraction(layer, compiled_fraction)
    other, other_bwd = elementwise_times(layer, split, gpu, profile, fused, kernels)
    cast_fwd, cast_bwd = fp8_cast_times(layer, split, gpu, profile, precision=precision,
                                        casts_weights=casts_fp8_weights,
                                        te_layers=kernels is not None)
    other, other_bwd = other + cast_fwd, other_bwd + cast_bwd
    overhead = profile.kernel_overhead_s if layer.gemms or layer.attention else 0.0
    fwd = gemm + att_fwd + other + overhead + deq_fwd
    bwd = 0.0
    if layer.in_backward:
        bwd = dgrad + wgrad + att_bwd + other_bwd + 2 * overhead + deq_bwd
    recomputed = 0.0  # none in a layer without backward: it saved nothing to rebuild
    if layer.in_backward and layer.kind is LayerKind.BLOCK and recompute is Recompute.FULL:
        recomputed = fwd
    elif layer.in_backward and recompute is Recompute.SELECTIVE and op_sac:
        recomputed = (op_sac_recompute_time(layer, split, gpu, linear.forward_peak, profile,
                                            fused, operand_bytes=linear.operand_bytes)
                      if layer.kind is LayerKind.BLOCK else 0.0)
    elif layer.in_backward and recompute is Recompute.SELECTIVE:
        recomputed = att_fwd
    return LayerTime(fwd_s=fwd, bwd_s=bwd, recompute_s=recomputed,
                     column_gemm_s=column_gemm_time(layer, split, gpu, linear.forward_peak,
                                                    profile, operand_bytes=linear.operand_bytes),
                     attention_fwd_s=att_fwd, attention_bwd_s=att_bwd, wgrad_s=wgrad)


def unshard_copy_time(params: float, copy_bytes: float, gpu: GpuSpec,
                      profile: ComputeProfile) -> float:
    """Seconds the copy kernels of ZeRO-3's gathers and reductions take on the compute stream
    for ``params`` gathered parameters, ``copy_bytes`` of HBM traffic each (FSDP2's
    all-gather copy-out and reduce-scatter copy-in: the runtime's ``unshard_copy_bytes``).
    They run between the layer's kernels, so no collective overlap hides them."""
    return params * copy_bytes / (gpu.memory_bandwidth_Bps * profile.memory_efficiency)
