"""Hand-built layers for cost-model tests whose expected values are worked by hand."""

from __future__ import annotations

from autoplan.graph.layer_graph import Attention, Layer, LayerKind


def attention_layer(seq: int, heads: int = 16, head_dim: int = 128,
                    dropout: float = 0.0) -> Layer:
    """A block of one causal self-attention call and nothing else, its FLOPs as
    FlopCounterMode counts the fused kernel per sample (dense ``4 h s^2 d``, backward 2.5x)."""
    fwd = 4.0 * heads * seq * seq * head_dim
    att = Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, seq_len=seq,
                    causal=True, dropout=dropout, fwd_flops=fwd, bwd_flops=2.5 * fwd)
    return Layer(name="attn", kind=LayerKind.BLOCK, num_params=0, params_sharded=0,
                 param_bytes=0, fwd_flops=fwd, bwd_flops=2.5 * fwd,
                 activation_bytes_sharded=0.0, activation_bytes_replicated=0.0,
                 attention_internal_bytes=0.0, elementwise_bytes_sharded=0.0,
                 elementwise_bytes_replicated=0.0, boundary_bytes=0.0, input_bytes=0.0,
                 attention=(att,))
