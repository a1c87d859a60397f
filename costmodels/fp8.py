"""What Transformer Engine's FP8 changes in a block: the rate of its GEMMs, the casts around
them, and the bytes it keeps.

Under ``fp8_autocast`` (Megatron-LM ``--fp8-format hybrid``, llm-foundry ``amp_fp8``) the
blocks' Linear layers are TE modules (``te.Linear``, ``LayerNormLinear``, ``LayerNormMLP``) and
run all three of their GEMMs (forward, input gradient, weight gradient) on FP8 operands with a
16-bit output, at the GPU's FP8 tensor-core peak times the share of the 16-bit GEMMs'
efficiency they reach, the two backward ones with the split accumulator (``linear_rate``).
Attention's core, the embedding and the LM
head are not TE Linears and stay 16-bit. TransformerEngine ``pytorch/module/linear.py``
(``_linear_forward_impl``, ``_Linear.backward``) and ``layernorm_linear.py`` do, per Linear:

- forward: quantize the input (``input_quantizer`` with row-wise and column-wise usage: one
  fused cast-transpose that reads the 16-bit input and writes an FP8 copy and its FP8
  transpose), and quantize the weight the same way (``quantize_weight``): every call where the
  module has no workspace cache (``cache_name`` is None when ``is_first_microbatch`` is not
  passed, as Composer and FSDP2 call it), else only on the first micro-batch of a step into
  ``_fp8_workspaces["weight"]``, which stays allocated (Megatron passes
  ``is_first_microbatch``). Where the weights are FP8 parameters themselves (Megatron's
  ``--fp8-param-gather``, which NeMo's ``bf16_with_fp8_mixed`` and Megatron-LM's FP8
  examples set and which needs the distributed optimizer, ZeRO 1 and up, or Megatron-FSDP),
  a ``Float8Tensor`` holds the FP8 data and its transpose, 2 bytes, in place of the 16-bit
  weight, the fp32 master is the optimizer's, and no workspace is kept;
- for backward it keeps the input's column-wise FP8 data only
  (``inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)``; under sequence
  parallelism the row-wise local shard, gathered again in backward): 1 byte an element;
  ``LayerNormLinear`` fuses the cast into the norm (``with_quantized_norm``) and keeps its FP8
  ``ln_out`` with the norm's 16-bit input and statistics;
- backward: quantize the output gradient (row-wise for the input-gradient GEMM, column-wise
  for the weight-gradient one: the same fused cast-transpose).

The amax histories and scales are a few floats per tensor (delayed scaling), left out. Also
left out: under sequence parallelism TE all-gathers a column-parallel Linear's input in FP8
(half the bytes of the bf16 gather) and makes its transpose after the gather in backward (read
1, write 1 per gathered element) instead of in the forward cast; and Megatron's once-a-step
weight cast (4 bytes per local weight, about 10 ms for 5B local parameters at 2.5 TB/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.catalog import GpuSpec
from autoplan.costmodels.profiles import ComputeProfile
from autoplan.costmodels.quantization import HALF_BYTES
from autoplan.graph.layer_graph import Gemm, Layer, LayerKind, TpSplit

FP8 = "fp8"
"""The training precision (training.Precision.FP8) under which TE runs the blocks in FP8."""

FP8_BYTES = 1.0
"""Bytes of one E4M3 or E5M2 element."""

CAST_TRANSPOSE_BYTES = HALF_BYTES + 2 * FP8_BYTES
"""HBM bytes per element of one fused cast-transpose: read the 16-bit element (2) and write
its FP8 row-wise copy and its FP8 transpose (1 + 1): 4."""

WEIGHT_WORKSPACE_BYTES = 2.0 * FP8_BYTES
"""Bytes per weight parameter of a TE Linear's cached FP8 weight: the row-wise copy for the
forward GEMM and the column-wise (transposed) one for the input-gradient GEMM."""


def runs_fp8(layer: Layer, precision: str) -> bool:
    """Whether the layer's Linears are TE FP8 GEMMs: FP8 training and a transformer block."""
    return precision == FP8 and layer.kind is LayerKind.BLOCK


@dataclass(frozen=True, slots=True)
class LinearRate:
    """The dense peak FLOP/s a layer's Linear GEMMs run at, in the forward and in backward
    (the input- and weight-gradient GEMMs), and their operand bytes per element."""

    forward_peak: float
    backward_peak: float
    operand_bytes: float


def linear_rate(layer: Layer, gpu: GpuSpec, precision: str,
                profile: ComputeProfile) -> LinearRate:
    """The rate of the layer's Linear GEMMs: the 16-bit peak and 2-byte operands, or in a
    block under FP8 1-byte operands at the FP8 peak times the share of the 16-bit plateau
    FP8 GEMMs reach (``fp8_gemm_share``), the backward ones slowed by the split accumulator:
    Transformer Engine passes ``use_split_accumulator`` False to the forward GEMM and True to
    the input- and weight-gradient ones (transformer_engine/pytorch/module/base.py
    ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = True``, ``_2X_ACC_WGRAD = True``; torchao's
    Float8LinearConfig keeps fast accumulation for the output GEMM only, likewise)."""
    if runs_fp8(layer, precision):
        forward = gpu.fp8_flops * profile.fp8_gemm_share
        return LinearRate(forward, forward / profile.fp8_split_accumulator_slowdown, FP8_BYTES)
    peak = gpu.peak_flops(precision)
    return LinearRate(peak, peak, HALF_BYTES)


def best_gemm_peak(gpu: GpuSpec, precision: str) -> float:
    """The fastest dense peak any GEMM of this precision runs at (a step-time bound's)."""
    return gpu.fp8_flops if precision == FP8 else gpu.peak_flops(precision)


def _local_weight_params(gemm: Gemm, tp: int) -> float:
    return gemm.weight_params / (tp if gemm.split is not TpSplit.NONE else 1)


def norm_fed(gemms: tuple[Gemm, ...]) -> set[str]:
    """The Linears that read a norm's output: the column-parallel ones whose input is the
    block's residual width (the row-parallel Linears' output), QKV and fc1 (or gate and up)."""
    width = {g.out_features for g in gemms if g.split is TpSplit.ROW}
    return {g.name for g in gemms if g.split is TpSplit.COLUMN and g.in_features in width}


def cast_bytes(shapes: list[tuple[Gemm, float, float, float]], *, tp: int,
               casts_weights: bool, fused_norm_inputs: frozenset[str] | set[str] = frozenset()
               ) -> tuple[float, float]:
    """(forward, backward) HBM bytes of TE's FP8 casts for one micro-batch: each Linear
    application's input cast-transpose (and its weight's where ``casts_weights``: no workspace
    cache), and in backward its output gradient's. ``shapes``: each of the layer's Gemms with
    its local (rows, k, n) on one GPU; ``fused_norm_inputs``: the Linears whose input a
    LayerNormLinear's norm writes in FP8 itself (2 bytes, row-wise and column-wise, where the
    16-bit ``ln_out`` took 2: no pass of their own; Megatron's TE layers, whose fused QKV and
    fc1 are one LayerNormLinear each)."""
    fwd = bwd = 0.0
    for gemm, rows, k, n in shapes:
        weight = _local_weight_params(gemm, tp) if casts_weights else 0.0
        inputs = 0.0 if gemm.name in fused_norm_inputs else rows * k
        fwd += gemm.count * CAST_TRANSPOSE_BYTES * (inputs + weight)
        if gemm.dgrad or gemm.wgrad:
            bwd += gemm.count * CAST_TRANSPOSE_BYTES * rows * n
    return fwd, bwd


def cast_times(fwd_bytes: float, bwd_bytes: float, gpu: GpuSpec,
               profile: ComputeProfile) -> tuple[float, float]:
    """Seconds of the casts, memory-bound at the GPU's achieved HBM bandwidth."""
    rate = gpu.memory_bandwidth_Bps * profile.memory_efficiency
    return fwd_bytes / rate, bwd_bytes / rate


def weights_cached_beside(zero_stage: int) -> bool:
    """Whether TE's FP8 weight workspace sits beside 16-bit weights: Megatron without the
    distributed optimizer, where ``--fp8-param-gather`` is refused (arguments.py); from ZeRO 1
    the weights are FP8 parameters (Float8Tensor data and transpose: 2 bytes, as the bf16
    weight they replace)."""
    return zero_stage == 0


def weight_workspace_bytes(layer: Layer, tp: int, precision: str, cached: bool) -> float:
    """Bytes of the layer's cached FP8 weights on one TP rank (WEIGHT_WORKSPACE_BYTES per
    trained or frozen Linear weight) where the runtime keeps TE's workspace cache."""
    if not (cached and runs_fp8(layer, precision)):
        return 0.0
    return WEIGHT_WORKSPACE_BYTES * sum(_local_weight_params(g, tp) for g in layer.gemms)
