"""Reference search: enumerate every candidate with estimate() and keep the best that fits.

Independent of CP-SAT, used by tests to check that the solver's optimum is the true optimum
of the same space under the same cost model, and by benchmarks for the speed ratio.
"""

from __future__ import annotations

from autoplan.costmodels.step import Problem, estimate, limit_mib, memory_mib
from autoplan.plan import Estimate, Plan
from autoplan.search.space import candidate_plans
from autoplan.training import Pins


def brute_force(problem: Problem, pins: Pins) -> tuple[Plan, Estimate] | None:
    """The fastest fitting plan, ties broken like the solver: microseconds of step time, then
    GPUs used, then GPUs per replica (tp*pp), then memory, then candidate order. None if
    nothing fits."""
    best, best_key = None, None
    for order, plan in enumerate(candidate_plans(
            problem.graph, world=problem.cluster.num_gpus,
            gpus_per_node=problem.cluster.gpus_per_node, training=problem.training, pins=pins)):
        est = estimate(problem, plan)
        if memory_mib(est.peak_memory_gib * 2**30) > limit_mib(problem):
            continue
        key = (round(est.step_time_s * 1e6), plan.world_size, plan.tp * plan.pp,
               est.peak_memory_gib, order)
        if best_key is None or key < best_key:
            best, best_key = (plan, est), key
    return best
