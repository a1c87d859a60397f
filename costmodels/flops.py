"""FLOPs per sample: the model's (the MFU basis) and the hardware's (with recomputation)."""

from __future__ import annotations

from autoplan.costmodels.problem import Problem
from autoplan.costmodels.ranks import recomputed_prefix

from autoplan.graph.layer_graph import LayerGraph, LayerKind
from autoplan.plan import Plan, Recompute


def model_flops_per_sample(graph: LayerGraph) -> float:
    """Model FLOPs (MFU basis): forward + backward, attention backward counted as 2x forward
    (Korthikanti et al. 2022 eq. 7), no recomputation."""
    total = graph.fwd_flops + graph.bwd_flops
    for layer in graph.layers:
        for att in layer.attention:
            total -= att.bwd_flops - 2 * att.fwd_flops
    return total


def hardware_flops_per_sample(graph: LayerGraph, recompute: Recompute,
                              recomputed: frozenset[int] | None = None) -> float:
    """FLOPs actually executed: model FLOPs plus the recomputed forward; ``recomputed`` lists
    the fully recomputed layers when not every block is (``recompute_num_layers``)."""
    extra = 0.0
    for index, layer in enumerate(graph.layers):
        if (recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
                and (recomputed is None or index in recomputed)):
            extra += layer.fwd_flops
        elif recompute is Recompute.SELECTIVE:
            extra += sum(a.fwd_flops for a in layer.attention)
    return model_flops_per_sample(graph) + extra


def recomputed_layers(problem: Problem, plan: Plan) -> frozenset[int] | None:
    """Indices of the fully recomputed layers under ``recompute_num_layers`` (None: all)."""
    if plan.recompute_num_layers is None:
        return None
    return frozenset(i for first, num in plan.layout for i in range(
        first, first + recomputed_prefix(problem, first, num, plan.recompute_num_layers)))
