"""How frozen weights are stored, and what that costs: bytes per parameter of each storage
format and the dequantization pass before each use.

bitsandbytes (which QLoRA and LLM.int8 fine-tunes use) quantizes the frozen ``nn.Linear``
weights only: embeddings, norms, biases and the LM head stay in the training precision
(transformers' ``get_keys_to_not_convert`` keeps the output embedding), and so do the
trained adapters. Each forward, and each backward that needs the input gradient, dequantizes
the weight to the training precision first (bitsandbytes ``MatMul4Bit`` / ``MatMul8bitLt``):
a memory-bound pass that reads the stored weight and writes a 2-byte copy.
"""

from __future__ import annotations

from autoplan.graph.layer_graph import Gemm, Layer, LayerKind
from autoplan.training import FrozenDtype

HALF_BYTES = 2
"""bf16/fp16 weights."""

NF4_BLOCK = 64
NF4_SECOND_BLOCK = 256
NF4_BITS = 4 + (8 + 32 / NF4_SECOND_BLOCK) / NF4_BLOCK
"""QLoRA's 4-bit NormalFloat with double quantization (Dettmers et al. 2023, sec. 3): 4 bits
per weight, one absmax per block of 64 quantized to 8 bits, and one fp32 constant per 256 of
those: 4 + (8 + 32/256)/64 = 4.127 bits per parameter."""

INT8_SCALE_BYTES = 4
"""LLM.int8 (Dettmers et al. 2022): int8 weights plus one fp32 scale per output row (SCB)."""


def stored_bytes_per_param(dtype: FrozenDtype, in_features: int) -> float:
    """Bytes one frozen Linear weight element takes in storage format ``dtype``."""
    if dtype is FrozenDtype.NF4:
        return NF4_BITS / 8
    if dtype is FrozenDtype.INT8:
        return 1 + INT8_SCALE_BYTES / in_features
    return HALF_BYTES


def quantized_gemms(layer: Layer) -> tuple[Gemm, ...]:
    """The frozen Linears of ``layer`` a quantized base stores in its format: not adapters,
    not the LM head, not experts (one Gemm stands for all of them)."""
    if layer.kind is LayerKind.HEAD:
        return ()
    experts = tuple(f"{e.name}." for e in layer.experts)
    return tuple(g for g in layer.gemms if not g.wgrad and not g.adapter
                 and not (experts and g.name.startswith(experts)))
