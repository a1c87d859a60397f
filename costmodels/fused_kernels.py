"""A transformer block's element-wise kernels as a framework runs them, and their HBM bytes.

The trace counts a block's memory-bound ops (norms, rotary, activation, dropout, residual adds)
as eager PyTorch dispatches them, each a kernel of its own with fp32 upcasts included. Megatron
runs its own fused kernels instead, so for it the block's element-wise traffic is the sum over
a small named table of the kernels its implementation (``--transformer-impl``) launches, each
costed by the tensors it reads and writes (:func:`block_kernels`):

- ``transformer_engine`` (Megatron-LM's default since megatron-core 0.8; megatron-core 0.16.1
  ``get_gpt_layer_with_transformer_engine_spec``): the two norms run inside TE's
  LayerNormColumnParallelLinear (QKV and fc1: ``input_layernorm`` and ``pre_mlp_layernorm``
  are IdentityOp), RoPE by TE's fused kernel (``apply_rope_fusion``, Megatron-LM's default
  unless ``--no-rope-fusion``), the activation by megatron's jit-fused bias-SwiGLU/bias-GeLU
  (``bias_activation_fusion``, fusions/fused_bias_swiglu.py, fused_bias_gelu.py) and each
  residual by the jit-fused bias-dropout-add (fusions/fused_bias_dropout.py).
- ``local`` (megatron-core's own modules, as Megatron-LM of 2021 ran them: Narayanan et al.
  2021, Korthikanti et al. 2022): apex FusedLayerNorm, the same jit-fused activation and
  bias-dropout-add, RoPE as eager torch ops (rope_utils._apply_rotary_pos_emb_bshd: the fused
  kernel needs TE), and the unfused core attention's ``permute(2, 0, 1, 3).contiguous()`` of
  its context (its softmax and dropout are priced with attention, compute.attention_time).

Other runtimes run the traced eager kernels (DeepSpeed, Hugging Face) or Inductor's fusions of
them (torchtitan with torch.compile: compute.fused_fraction).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import ConstraintError
from autoplan.graph.layer_graph import Layer, LayerGraph, LayerKind, ModelDims

TRANSFORMER_IMPLS = ("transformer_engine", "local")
"""The implementations a runtime's ``transformer_impl`` may name (Megatron-LM's
``--transformer-impl`` choices); None: the traced eager kernels."""

MASK_BYTES = 1.0
"""Dropout's saved mask: one bool byte per element (torch's native_dropout)."""

ROPE_UNFUSED_FWD_MOVES = 12.0
"""Element reads and writes per rotated element of ``t * cos + rotate_half(t) * sin`` as
eager ops (rope_utils): mul by cos 2, neg of the half 1, cat 2, mul by sin 2, add 3, the final
``cat((t, t_pass))`` copy 2."""

ROPE_UNFUSED_BWD_MOVES = 10.0
"""Its backward: the two muls 2 each, neg 1, chunk's gradient assembled by a cat 2, the two
gradients of ``t`` summed 3 (the adds' and cats' own backward are views)."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """One element-wise kernel of a block: bytes it reads and writes per token in forward and
    backward; ``sharded``: its tensors are split by TP (else the hidden width, split only
    under sequence parallelism)."""

    name: str
    sharded: bool
    fwd_bytes: float
    bwd_bytes: float


@dataclass(frozen=True, slots=True)
class BlockTraffic:
    """A block's element-wise HBM bytes per sample, forward and backward, split as
    Layer.elementwise_bytes_sharded/_replicated are."""

    fwd_sharded: float
    fwd_replicated: float
    bwd_sharded: float
    bwd_replicated: float


def check_impl(impl: str | None) -> None:
    """Raises ConstraintError for an implementation no table describes."""
    if impl is not None and impl not in TRANSFORMER_IMPLS:
        raise ConstraintError(f"runtime setting transformer_impl {impl!r} is not one autoplan "
                              f"prices; choose from {', '.join(TRANSFORMER_IMPLS)}.")


def _norm(name: str, dims: ModelDims, b: float) -> Kernel:
    """Norm: reads x, writes its output; saves fp32 statistics per token (rsigma, and mu for
    LayerNorm). Backward reads x, dy and the statistics, writes dx."""
    stats = 4.0 if dims.rmsnorm else 8.0
    h = dims.hidden_size
    return Kernel(name, False, 2 * h * b + stats, 3 * h * b + stats)


def _bias_dropout_add(name: str, dims: ModelDims, b: float, dropout: float) -> Kernel:
    """out = residual + dropout(x + bias): reads x and the residual, writes out (and the
    mask). Backward: the residual's gradient is dy itself; x's is dy * mask (reads dy and the
    mask, writes dx) with dropout, dy itself without; the bias gradient reads dy."""
    h = dims.hidden_size
    mask = MASK_BYTES * h if dropout > 0 else 0.0
    bwd = (2 * h * b + mask if dropout > 0 else 0.0) + (h * b if dims.linear_bias else 0.0)
    return Kernel(name, False, 3 * h * b + mask, bwd)


def _activation(dims: ModelDims, b: float) -> Kernel:
    """Jit-fused bias-SwiGLU (reads 2F, writes F; swiglu_back reads dy and 2F, writes 2F) or
    bias-GeLU (reads F, writes F; bias_gelu_back reads dy and F, writes F), per TP rank's
    share of F = ffn_hidden_size; with a bias, its gradient reads the input gradient once more
    (a reduction over tokens)."""
    f = dims.ffn_hidden_size
    width = 2 * f if dims.gated_mlp else f
    bias_grad = width * b if dims.linear_bias else 0.0
    if dims.gated_mlp:
        return Kernel("bias-SwiGLU (jit fused)", True, 3 * f * b, 5 * f * b + bias_grad)
    return Kernel("bias-GeLU (jit fused)", True, 2 * f * b, 3 * f * b + bias_grad)


def _rope(impl: str, dims: ModelDims, head_dim: int, b: float) -> tuple[Kernel, ...]:
    """RoPE over the queries and keys of a token ((heads + KV heads) x head_dim elements)."""
    if not dims.rotary:
        return ()
    n = (dims.num_heads + dims.num_kv_heads) * head_dim
    if impl == "transformer_engine":
        # fused_apply_rotary_pos_emb: reads q and k, writes them; backward the same on dy
        return (Kernel("fused RoPE (TE)", True, 2 * n * b, 2 * n * b),)
    return (Kernel("RoPE (eager torch ops)", True, ROPE_UNFUSED_FWD_MOVES * n * b,
                   ROPE_UNFUSED_BWD_MOVES * n * b),)


def block_kernels(impl: str, dims: ModelDims, head_dim: int, dropout: float,
                  b: float) -> tuple[Kernel, ...]:
    """The element-wise kernels one pre-norm GPT block runs under ``impl``; ``b``: bytes per
    activation element, ``dropout``: the block's dropout probability."""
    kernels = [_norm("input norm", dims, b), *_rope(impl, dims, head_dim, b)]
    if impl == "local":
        # DotProductAttention: context.permute(2, 0, 1, 3).contiguous(), reads and writes the
        # context (heads x head_dim); its backward is a view
        context = dims.num_heads * head_dim
        kernels.append(Kernel("context permute copy", True, 2 * context * b, 0.0))
    kernels += [_bias_dropout_add("attention bias-dropout-add", dims, b, dropout),
                _norm("pre-MLP norm", dims, b), _activation(dims, b),
                _bias_dropout_add("MLP bias-dropout-add", dims, b, dropout)]
    return tuple(kernels)


def block_traffic(graph: LayerGraph, layer: Layer, impl: str | None,
                  precision: str) -> BlockTraffic | None:
    """The block's element-wise bytes per sample from ``impl``'s kernel table; None where the
    traced eager traffic stands (no implementation, not a dense block of the model's shape)."""
    dims = graph.dims
    if (impl is None or dims is None or layer.kind is not LayerKind.BLOCK or layer.experts
            or not layer.attention):
        return None
    attention = layer.attention[0]
    b = 4.0 if precision == "fp32" else 2.0
    kernels = block_kernels(impl, dims, attention.head_dim, attention.dropout, b)
    tokens = graph.seq_len

    def total(sharded: bool, backward: bool) -> float:
        return tokens * sum(k.bwd_bytes if backward else k.fwd_bytes
                            for k in kernels if k.sharded is sharded)

    return BlockTraffic(total(True, False), total(False, False), total(True, True),
                        total(False, True))
