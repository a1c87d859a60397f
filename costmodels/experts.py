"""Expert parallelism (EP) of mixture-of-experts layers: what a GPU holds and what it sends.

Megatron-core's scheme (megatron/core/transformer/moe, MoEAlltoAllTokenDispatcher): the experts
of each MoE layer are split over ``ep`` ranks taken from the data-parallel replicas, so a GPU
holds ``num_experts / ep`` of them (TP still splits each expert, as it does by default:
expert tensor parallelism = TP). Routing is balanced (as traced), so compute is unchanged;
each MoE layer adds, per micro-batch, two all-to-alls of the routed tokens forward (dispatch to
the experts' ranks, combine back) and two backward (their gradients), plus the forward's two
again when the layer is fully recomputed. They sit between the router and the experts, on the
critical path, and are counted exposed (no overlap with compute is modelled).
"""

from __future__ import annotations

from math import gcd

from autoplan.cluster.topology import GroupLinks
from autoplan.costmodels import comm
from autoplan.costmodels.compute import Split
from autoplan.graph.layer_graph import Experts, Layer

TOKEN_BYTES = 2
"""bf16/fp16 bytes per element of a routed token's hidden vector."""

FORWARD_ALL_TO_ALLS = 2  # dispatch and combine
BACKWARD_ALL_TO_ALLS = 2  # their gradients, in reverse


def expert_params(layer: Layer) -> int:
    """Parameters of the layer's experts (all of them, before TP or EP split them)."""
    return sum(e.num_experts * e.params_per_expert for e in layer.experts)


def expert_hidden_size(layer: Layer, experts: Experts) -> int:
    """Width of a routed token: the output of the experts' last Linear (the down projection
    back to the hidden size), from the layer's traced GEMMs."""
    own = [g for g in layer.gemms if g.name.startswith(experts.name)]
    return own[-1].out_features


def routed_bytes(layer: Layer, split: Split) -> float:
    """Bytes one GPU sends in one all-to-all of one micro-batch, summed over the layer's MoE
    modules: its tokens (the sequence split by CP, and by TP: Megatron requires sequence
    parallelism with EP and TP) times top_k copies of the hidden vector."""
    rows = sum(e.tokens_per_expert * e.num_experts * expert_hidden_size(layer, e)
               for e in layer.experts)  # tokens * top_k hidden vectors per sample
    return rows * TOKEN_BYTES * split.mbs / (split.cp * split.tp)


def all_to_alls(full_recompute: bool) -> int:
    """All-to-alls per MoE layer and micro-batch (the recomputed forward repeats its two)."""
    return BACKWARD_ALL_TO_ALLS + FORWARD_ALL_TO_ALLS * (2 if full_recompute else 1)


def ep_comm_time(layer: Layer, split: Split, ep_links: GroupLinks, *,
                 full_recompute: bool) -> float:
    """Exposed all-to-all seconds of one layer for one micro-batch over the EP group."""
    if not layer.experts or ep_links.size <= 1:
        return 0.0
    return all_to_alls(full_recompute) * comm.all_to_all_time(routed_bytes(layer, split), ep_links)


def common_expert_count(layers) -> int | None:
    """The number of experts every MoE layer of the model has in common (their gcd; EP must
    divide it), or None for a dense model."""
    counts = [e.num_experts for layer in layers for e in layer.experts]
    if not counts:
        return None
    result = 0
    for c in counts:
        result = gcd(result, c)
    return result
