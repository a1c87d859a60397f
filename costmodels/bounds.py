"""Step times no plan can beat: on the whole cluster, and for one shape whatever its stages
and switches (the search prunes shapes with them)."""

from __future__ import annotations

from autoplan.costmodels.compute import Split, best_attention_fraction
from autoplan.costmodels.flops import model_flops_per_sample
from autoplan.costmodels.fp8 import best_gemm_peak
from autoplan.costmodels.layers import layer_cost
from autoplan.costmodels.problem import Problem, memo

from autoplan.cluster.topology import GroupLinks, group_links
from autoplan.plan import Recompute


def lower_bound_s(problem: Problem) -> float:
    """A step time no plan can beat under this cost model: the model's FLOPs spread over every
    GPU of the cluster at the best efficiency any kernel reaches, with nothing else (each
    group's GPUs at their own rate on a heterogeneous cluster)."""
    samples = problem.training.global_batch
    if problem.cluster.is_homogeneous:
        rate = problem.cluster.num_gpus * _best_rate(problem)
    else:
        rate = sum(g.num_gpus * _best_rate(problem.on_group(g.name)) for g in problem.cluster.groups)
    return model_flops_per_sample(problem.graph) * samples / rate


def _best_rate(problem: Problem) -> float:
    """FLOP/s of one GPU at the best efficiency any kernel reaches (GEMMs at their fastest
    peak: the FP8 one under FP8)."""
    gpu = problem.cluster.gpu
    peak = gpu.peak_flops(problem.precision)
    return max(best_gemm_peak(gpu, problem.precision) * problem.compute.gemm_efficiency,
               peak * best_attention_fraction(problem.compute, peak,
                                              problem.runtime.attention_kernel))


def shape_lower_bound_s(problem: Problem, *, tp: int, pp: int, cp: int, mbs: int, vpp: int,
                        num_microbatches: int, zero_bubble: bool = False) -> float:
    """A step time no plan of this shape can beat, whatever its stages and switches.

    Every layer runs once per micro-batch on some pipeline rank, so the ranks' micro-batch
    times sum to at least S, the layers' compute and TP collectives without recomputation
    (the cheaper of with and without SP); the slowest rank takes at least S / pp, and the
    schedule ``m * max + (sum - max) / v`` is then at least ``(m - 1/v) S / pp + S / v``
    (``m S / pp`` under a ``zero_bubble`` schedule, which may hide all of its fill and drain).
    Pipeline sends, ring attention, data-parallel reduction and the optimizer only add time.
    """
    key = ("shape-bound", tp, cp, mbs)
    per_microbatch = memo(problem).get(key)
    if per_microbatch is None:
        links = (group_links(problem.cluster, tp, 1),  # TP innermost: its fastest links
                 group_links(problem.cluster, cp, tp))  # (ring attention is left out)
        counts = problem.layer_counts(0, len(problem.graph.layers))
        per_microbatch = min(
            sum(k * _layer_time_and_tp_comm(problem, c, Split(
                tp=tp, cp=cp, sp=sp, mbs=mbs, flash=problem.flash_attention,
                kernel=problem.runtime.attention_kernel),
                                            *links) for c, k in counts)
            for sp in ((False, True) if tp > 1 else (False,)))
        memo(problem)[key] = per_microbatch
    m = num_microbatches
    if zero_bubble:
        return m * per_microbatch / pp
    return (m - 1 / vpp) * per_microbatch / pp + per_microbatch / vpp


def _layer_time_and_tp_comm(problem: Problem, class_id: int, split: Split,
                            tp_links: GroupLinks, cp_links: GroupLinks) -> float:
    cost = layer_cost(problem, problem.layer_class(class_id), class_id, split, Recompute.NONE,
                       tp_links, cp_links)
    return cost.compute_s + cost.tp_comm_s
