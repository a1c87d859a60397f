"""What a transformer block saves for backward when Megatron runs it with Transformer Engine.

The trace records the tensors the model's own eager PyTorch saves (fp32 norm upcasts, rotary
as eager ops, an unfused activation). megatron-core 0.16.1 with ``--transformer-impl
transformer_engine`` (``get_gpt_layer_with_transformer_engine_spec``) runs a different set of
kernels, and each keeps for backward (per token, ``b`` bytes per activation element):

- the two norms inside TE's LayerNormColumnParallelLinear (QKV and fc1): the norm's input for
  its own backward and its output ``ln_out`` for the weight gradient (under sequence
  parallelism the local shard, all-gathered again in backward), ``h b`` each, and the fp32
  statistics (``rsigma``, and ``mu`` for LayerNorm): 4 or 8 bytes;
- RoPE by TE's fused kernel (``apply_rope_fusion``): only its frequencies, not its input;
- flash / cuDNN attention: q and k (as rotated), v, the output and the fp32 softmax
  log-sum-exp per head; the output is also linear_proj's saved input (one storage). TE's
  attention makes v (a strided view of the QKV GEMM's output) contiguous, so the fused QKV
  output itself is not kept;
- the jit-fused bias-SwiGLU / bias-GeLU (fusions/fused_bias_swiglu.py, fused_bias_gelu.py):
  its input, fc1's output (2F wide gated, F otherwise); fc2 saves the activation's output, F;
- each jit-fused bias-dropout-add its mask (1 byte per hidden element) where dropout > 0, else
  nothing (``F.dropout`` with p = 0 returns its input).

Under FP8 (costmodels.fp8) each TE Linear keeps its GEMM input as FP8 (1 byte an element)
instead: ``ln_out`` of both norms and fc2's input (the activation's output) take 1 byte, and
linear_proj keeps an FP8 copy of the attention output (1 byte) beside the 16-bit one flash
attention keeps; the norms' inputs, q, k, v, the output and fc1's output (the fused
activation's input) stay 16-bit.

This is Korthikanti et al. 2022's ``34 s b h`` (sec. 4.1) with flash attention in place of
the score tensors, grouped-query K/V, the ffn width in place of 4h and the norm statistics.
Hidden-width tensors are split only by sequence parallelism, the rest by TP
(memory.layer_activation_bytes divides them); the log-sum-exp is an attention internal, which
Megatron's selective recompute of core attention does not keep.
"""

from __future__ import annotations

import dataclasses

from autoplan.costmodels.fp8 import FP8, FP8_BYTES
from autoplan.graph.layer_graph import Attention, Layer, LayerGraph, LayerKind, ModelDims

LSE_BYTES = 4.0
"""fp32 softmax log-sum-exp per query head and token (flash / cuDNN fused attention)."""

MASK_BYTES = 1.0
"""A dropout mask's byte per element (the jit-fused bias-dropout-add)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SavedPerToken:
    """Bytes a block saves per token, split as Layer's activation fields are."""

    sharded: float
    replicated: float
    attention_internal: float


def te_block_saved(dims: ModelDims, attention: Attention, b: float,
                   gemm_input_bytes: float | None = None) -> SavedPerToken:
    """Per-token bytes a megatron-core + Transformer Engine block saves (module docstring);
    ``gemm_input_bytes``: bytes an element of the TE Linears' own saved inputs (FP8_BYTES
    under FP8), None: ``b``, the 16-bit tensors they share."""
    h = dims.hidden_size
    g = b if gemm_input_bytes is None else gemm_input_bytes
    stats = 4.0 if dims.rmsnorm else 8.0
    norms = 2 * (h * b + h * g + stats)  # each norm's input and ln_out, and its statistics
    masks = 2 * MASK_BYTES * h if attention.dropout > 0 else 0.0
    width = attention.num_heads * attention.head_dim
    q_and_out = 2 * width * b
    proj_input = 0.0 if gemm_input_bytes is None else width * g  # its own FP8 copy of the out
    k_and_v = 2 * attention.num_kv_heads * attention.head_dim * b
    f = dims.ffn_hidden_size
    mlp = ((2 * f) if dims.gated_mlp else f) * b + f * g  # the activation's input and output
    return SavedPerToken(sharded=q_and_out + proj_input + k_and_v + mlp,
                         replicated=norms + masks,
                         attention_internal=LSE_BYTES * attention.num_heads)


def megatron_saved_layer(graph: LayerGraph, layer: Layer, impl: str | None,
                         precision: str) -> Layer:
    """``layer`` with its saved bytes as megatron-core with Transformer Engine saves them,
    where ``impl`` is ``transformer_engine`` and the layer is a dense, fully trained block of
    the model's shape; else ``layer`` as traced."""
    dims = graph.dims
    if (impl != "transformer_engine" or dims is None or layer.kind is not LayerKind.BLOCK
            or layer.experts or len(layer.attention) != 1 or layer.frozen_params):
        return layer
    saved = te_block_saved(dims, layer.attention[0], 4.0 if precision == "fp32" else 2.0,
                           FP8_BYTES if precision == FP8 else None)
    tokens = graph.seq_len
    return dataclasses.replace(layer, activation_bytes_sharded=saved.sharded * tokens,
                               activation_bytes_replicated=saved.replicated * tokens,
                               attention_internal_bytes=saved.attention_internal * tokens)
