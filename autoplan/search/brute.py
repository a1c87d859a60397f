"""Reference search: enumerate every candidate with estimate() and keep the best that fits.

Independent of CP-SAT, used by tests to check that the solver's optimum is the true optimum
of the same space under the same cost model, and by benchmarks for the speed ratio.
"""

from __future__ import annotations

from autoplan.costmodels.problem import MIB, Problem, limit_mib, memory_mib
from autoplan.costmodels.step import estimate
from autoplan.plan import Estimate, Plan
from autoplan.search.groups_space import group_candidates
from autoplan.search.objective import key as objective_key
from autoplan.search.objective import meets_throughput
from autoplan.search.space import candidate_plans
from autoplan.training import Bounds, Objective, Pins


def brute_force(problems: Problem | list[Problem], pins: Pins, *,
                objective: Objective | None = None, bounds: Bounds | None = None,
                max_gpus: int | None = None, every_split: bool = True
                ) -> tuple[Plan, Estimate] | None:
    """The best fitting plan that reaches the throughput, ties broken like the solver: the
    objective's integer keys, then GPUs used, then GPUs per replica (tp*pp), then memory, then
    candidate order. ``problems`` are alternatives (one per allowed global batch). None if
    nothing qualifies. On a heterogeneous cluster the candidates are every stage-to-group
    assignment and every split of the blocks (``groups_space``; the menu where blocks are not
    all alike, as in the search), a plan fits when every stage
    fits its own group's limit, and exact step time replaces memory in the tie-break. The stage
    splits are every composition of the blocks where CP-SAT chooses the split
    (``space.split_is_chosen``); ``every_split`` False keeps the menu (large models)."""
    problems = [problems] if isinstance(problems, Problem) else list(problems)
    objective = objective or Objective()
    per_token = len({p.training.global_batch for p in problems}) > 1
    best, best_key, order = None, None, 0
    for problem in problems:
        world = min(problem.cluster.num_gpus, max_gpus or problem.cluster.num_gpus)
        tokens = problem.training.tokens_per_step
        for plan in _candidates(problem, world, pins, bounds, max_gpus, objective.needs_every_dp,
                                every_split):
            order += 1
            est = estimate(problem, plan)
            if not _fits(problem, est):
                continue
            if not meets_throughput(objective, est.step_time_s, tokens):
                continue
            tiebreak = (est.peak_memory_gib if plan.stage_groups is None  # hetero: as its search
                        else est.step_time_s)
            key = objective_key(objective, est.step_time_s, plan.world_size, tokens,
                                per_token=per_token) + (
                plan.world_size, plan.tp * plan.pp, tiebreak, order)
            if best_key is None or key < best_key:
                best, best_key = (plan, est), key
    return best


def _candidates(problem: Problem, world: int, pins: Pins, bounds: Bounds | None,
                max_gpus: int | None, every_dp: bool, every_split: bool):
    if not problem.cluster.is_homogeneous:
        return group_candidates(problem.graph, problem.cluster, problem.training, pins, bounds,
                                max_gpus, every_dp)
    return candidate_plans(problem.graph, world=world, gpus_per_node=problem.cluster.gpus_per_node,
                           training=problem.training, pins=pins, bounds=bounds, every_dp=every_dp,
                           every_split=every_split)


def _fits(problem: Problem, est: Estimate) -> bool:
    """Every stage within its limit, in whole MiB like the solver."""
    if est.stage_memory_limit_gib is None:
        return memory_mib(est.peak_memory_gib * 2**30) <= limit_mib(problem)
    return all(memory_mib(m * 2**30) <= int(limit * 2**30 // MIB)
               for m, limit in zip(est.stage_memory_gib, est.stage_memory_limit_gib))
