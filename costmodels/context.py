"""Context parallelism: ring attention over cp GPUs (Megatron-LM ``--context-parallel-size``,
torchtitan ``context_parallel_degree``).

Each sequence is cut into 2*cp chunks and GPU i keeps chunks i and 2cp-1-i, which balances the
causal mask's work. Everything but attention is token-local and runs on s/cp tokens (compute.py
and memory.py divide tokens, activations and TP/PP messages by cp). Attention runs as a ring of
cp steps: each computes the local queries against one K,V block while the next block travels to
the neighbour, so a layer's forward sends its K,V block cp-1 times and its backward sends K,V
and their gradients dK,dV (twice the bytes) cp-1 times. A transfer hides under the attention
work of its step when shorter (Liu et al. 2023, "Ring Attention with Blockwise Transformers";
Megatron-LM context-parallel docs).
"""

from __future__ import annotations

from autoplan.cluster.topology import GroupLinks
from autoplan.costmodels import comm
from autoplan.costmodels.compute import LayerTime, Split
from autoplan.graph.layer_graph import Layer

ACTIVATION_BYTES = 2
"""bf16/fp16 K and V."""

KV_TENSORS = 2
"""K and V."""


def kv_block_bytes(layer: Layer, split: Split) -> float:
    """Bytes of one GPU's K and V block for one micro-batch: ``2 * (s/cp) * kv_heads/tp *
    head_dim`` elements per attention call (TP splits the heads)."""
    elements = sum(KV_TENSORS * att.seq_len / split.cp * att.num_kv_heads * att.head_dim
                   for att in layer.attention)
    return elements * ACTIVATION_BYTES * split.mbs / split.tp


def ring_attention_time(layer: Layer, split: Split, t: LayerTime, links: GroupLinks, *,
                        recomputed: bool) -> float:
    """Exposed ring transfers of one layer for one micro-batch (``recomputed``: the attention
    forward runs again in backward, ring included)."""
    if split.cp == 1 or not layer.attention:
        return 0.0
    steps, kv = split.cp - 1, kv_block_bytes(layer, split)
    forward = steps * max(0.0, comm.p2p_time(kv, links) - t.attention_fwd_s / split.cp)
    backward = steps * max(0.0, comm.p2p_time(2 * kv, links) - t.attention_bwd_s / split.cp)
    return forward * (2 if recomputed else 1) + backward
