"""Search for the best plan on a heterogeneous cluster (stages on node groups).

For each (shape, switches, assignment of groups along the pipeline) of ``groups_space``, the
blocks per stage are chosen by the partition's CP-SAT model (``search.partition``), the same
model as on one kind of GPU: a stage on a node group is one row of its table, with that
group's GPU and links in its micro-batch time t_r and post-drain term e_r (costmodels.groups)
and that group's memory limit excluding counts, and the model minimizes
    (m - 1) * max_r t_r + sum_r t_r + max_r e_r,
which on node groups is the step itself (each stage's own post-drain term). Its near-optimal
splits are re-evaluated in floats with the same ``stage_cost`` and ``step_time`` as
``estimate()``, so the answer is ``estimate()``'s best split (``partition.best_split_on_groups``;
tests/search check it against every composition). That needs blocks that are all alike (a
stage's costs then depend on its rank, group, neighbours' groups and count); other models take
the best of the menu (``space.stage_variants``), as they do on one kind of GPU.

Tie-break (as ``brute``'s on heterogeneous clusters): the objective's key, then fewer GPUs,
then tp*pp, then the exact step time, then the enumeration order of ``groups_space`` (shape,
assignment, switches, blocks lexicographically), so the same input gives the same plan.

Order and pruning (best bound first, like ``table.Table.build``). A stage at rank r with b
blocks takes at least a_r + b c_r (compute and TP time only; c_r per block on its group, a_r the
embedding or head it also holds). Spreading the B blocks fluidly,
    max t >= (B + sum_r a_r / c_r) / sum_r 1 / c_r,     sum t >= sum_r a_r + B min_r c_r.
A shape's bound holds for every assignment and switch (recompute off; each rank's least a, and
the per-block rates of the fastest groups filled up to their capacity); an assignment's uses
its own groups, a switch setting its own recompute. The partition then prunes with the best
plan found: its hint's least slowest stage bounds every split before the model is built, and
the model's optimum before its window is enumerated. The bounds need blocks that all cost the
same (true of transformer stacks); otherwise they are 0. With a deadline the search stops and
reports the best plan with the smallest open bound (or the cluster's physics bound for shapes
never bounded): status FEASIBLE, with its gap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autoplan.costmodels.compute import Split
from autoplan.costmodels.groups import stage_cost, step_time
from autoplan.costmodels.problem import Problem, layer_key
from autoplan.costmodels.placement import plan_axis_links
from autoplan.costmodels.layers import layer_cost
from autoplan.costmodels.step import estimate
from autoplan.costmodels.bounds import lower_bound_s
from autoplan.errors import ConstraintError, InfeasibleError, NoPlanInTimeError
from autoplan.plan import Estimate, Plan, Recompute, SolverInfo
from autoplan.search.groups_space import (
    Assignment, assignments, capacity, group_plan, group_shapes, shape_switches, stage_groups,
)
from autoplan.search.objective import key as objective_key
from autoplan.search.objective import meets_throughput
from autoplan.search.objective import value as objective_value
from autoplan.search.partition import best_split_on_groups
from autoplan.search.space import (
    Shape, Switches, balanced_stages, block_counts, make_plan, stage_variants, uniform_blocks,
)
from autoplan.training import DEFAULT_PLACEMENT, Bounds, Objective, ObjectiveTerm, Pins

SORTED_ASSIGNMENTS = 20_000
"""Assignments of one shape sorted by bound before expanding; past this many (ten groups, deep
pipelines) they are expanded as generated, so the deadline is met without listing them all."""

BOUND_SLACK = 1e-9
"""Relative margin taken off every bound: they are computed in a different float order than
the steps they bound."""


@dataclass(frozen=True)
class GroupSolution:
    """The best plan found, its estimate, the search report and the problem it was made for."""

    plan: Plan
    estimate: Estimate
    info: SolverInfo
    problem: Problem


@dataclass(frozen=True, slots=True)
class _Split:
    """The DP's answer for one (shape, switches, assignment)."""

    step_s: float
    blocks: tuple[int, ...]


def _settings(problem: Problem, shape: Shape, sw: Switches) -> Plan:
    """A plan carrying the shape and switches (stage_cost reads only those)."""
    return make_plan(shape, sw, balanced_stages(problem.graph, shape.pp), problem.training)


class _Bounds:
    """Lower bounds on the step from per-block and per-stage compute+TP times per group: a stage
    at rank r on group g with b blocks takes at least a + b*c (pipeline sends and post-drain
    time dropped). Exact only for models whose blocks all cost the same (``uniform``); for
    others every bound is 0 and nothing is pruned."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        graph = problem.graph
        self.starts = graph.block_indices()
        kinds = {layer_key(graph.layers[i]) for i in self.starts}
        self.uniform = len(kinds) == 1 and self.starts == list(
            range(self.starts[0], self.starts[-1] + 1))
        self.num_blocks = len(self.starts)
        self._terms: dict[tuple, tuple[float, float]] = {}

    def _layer_time(self, group: str, plan: Plan, recompute: Recompute, first: int,
                    num: int) -> float:
        sub = self.problem.on_group(group)
        split = Split.of(plan, self.problem.flash_attention, self.problem.runtime)
        tp_links, cp_links, total = plan_axis_links(sub, plan, "tp"), plan_axis_links(sub, plan, "cp"), 0.0
        for class_id, count in sub.layer_counts(first, num):
            cost = layer_cost(sub, sub.layer_class(class_id), class_id, split, recompute,
                               tp_links, cp_links)
            total += count * (cost.compute_s + cost.tp_comm_s)
        return total

    def terms(self, group: str, plan: Plan, recompute: Recompute, rank: int) -> tuple[float, float]:
        """(a, c) of a stage at ``rank`` on ``group``."""
        pp = plan.pp
        kind = (rank == 0, rank == pp - 1)
        key = (group, plan.tp, plan.micro_batch_size, plan.sequence_parallel, recompute, kind)
        found = self._terms.get(key)
        if found is None:
            starts, end = self.starts, len(self.problem.graph.layers)
            c = self._layer_time(group, plan, recompute, starts[0], 1)
            a = 0.0
            if kind[0] and starts[0]:
                a += self._layer_time(group, plan, recompute, 0, starts[0])
            if kind[1] and end - starts[-1] - 1:
                a += self._layer_time(group, plan, recompute, starts[-1] + 1, end - starts[-1] - 1)
            found = self._terms[key] = (a, c)
        return found

    def shape_bound(self, plan: Plan, recompute: Recompute, caps: dict[str, int], m: int) -> float:
        """Bound over every assignment: each rank's least fixed time, and the fastest groups
        filled up to their capacity for the per-block rate."""
        if not self.uniform:
            return 0.0
        pp, names = plan.pp, [n for n, k in caps.items() if k]
        per_rank = [[self.terms(g, plan, recompute, r) for g in names] for r in range(pp)]
        rates = sorted(((1 / self.terms(g, plan, recompute, min(1, pp - 1))[1], caps[g])
                        for g in names), reverse=True)
        rate, left = 0.0, pp
        for r, k in rates:
            rate += r * min(k, left)
            left -= min(k, left)
        shifted = sum(min(a / c for a, c in options) for options in per_rank)
        slowest = (self.num_blocks + shifted) / rate
        total = (sum(min(a for a, _ in options) for options in per_rank)
                 + self.num_blocks * min(c for options in per_rank for _, c in options))
        return ((m - 1) * slowest + total) * (1 - BOUND_SLACK)

    def assignment_bound(self, plan: Plan, recompute: Recompute, groups: tuple[str, ...],
                         m: int) -> float:
        """Bound over every split of the blocks with stage r on ``groups[r]`` (the module
        docstring's fluid spread, summed from the last rank)."""
        if not self.uniform:
            return 0.0
        shifted = rate = fixed = 0.0
        c_min = math.inf
        for rank in range(plan.pp - 1, -1, -1):
            a, c = self.terms(groups[rank], plan, recompute, rank)
            shifted, rate, fixed, c_min = shifted + a / c, rate + 1 / c, fixed + a, min(c_min, c)
        slowest = (self.num_blocks + shifted) / rate
        return ((m - 1) * slowest + (fixed + self.num_blocks * c_min)) * (1 - BOUND_SLACK)


class _Search:
    """Best-bound-first search over shapes, assignments and switches of one problem list."""

    def __init__(self, problems: list[Problem], pins: Pins, objective: Objective,
                 bounds: Bounds | None, max_gpus: int | None, deadline: float) -> None:
        self.problems, self.pins, self.objective = problems, pins, objective
        self.user_bounds, self.max_gpus, self.deadline = bounds, max_gpus, deadline
        self.best: tuple | None = None  # (order, plan, problem)
        self.open_bound_s = math.inf
        self.unproven_bound_s = math.inf  # least step of splits CP-SAT's limit left unproven
        self.pools: dict = {}  # stage tables solved -> their near-optimal splits
        self.per_token = len({p.training.global_batch for p in problems}) > 1
        """Step times of different global batches compare only per token (as in solver)."""

    def key(self, step_s: float, shape: Shape, problem: Problem) -> tuple[int, ...]:
        world = shape.tp * shape.pp * shape.dp * shape.cp
        return objective_key(self.objective, step_s, world, problem.training.tokens_per_step,
                             per_token=self.per_token)

    def beaten(self, bound_s: float, shape: Shape, problem: Problem) -> bool:
        """The best plan so far is strictly better than anything with this bound."""
        return self.best is not None and self.key(bound_s, shape, problem) > self.best[0][0]

    def split_unproven(self, floor_s: float) -> None:
        """A split CP-SAT did not prove optimal: the best is proven only down to ``floor_s``."""
        self.unproven_bound_s = min(self.unproven_bound_s, floor_s)

    def late(self, bound_s: float) -> bool:
        if time.perf_counter() <= self.deadline:
            return False
        self.open_bound_s = min(self.open_bound_s, bound_s)
        return True

    def run(self) -> None:
        shapes = []
        for problem in self.problems:
            limits = _Bounds(problem)
            every = self.objective.needs_every_dp
            for shape in group_shapes(problem.graph, problem.cluster, problem.training,
                                      self.pins, self.user_bounds, self.max_gpus, every):
                if time.perf_counter() > self.deadline:  # never bounded: only physics bounds it
                    self.open_bound_s = min(self.open_bound_s, lower_bound_s(problem))
                    break
                caps = capacity(problem.cluster, problem.graph, shape.tp, shape.dp, self.pins)
                options = shape_switches(shape, problem.training, self.pins)
                if not options:
                    continue
                m = shape.num_microbatches(problem.training.global_batch)
                bound = min(limits.shape_bound(_settings(problem, shape, sw), Recompute.NONE,
                                               caps, m) for sw in _by_sp(options))
                shapes.append((bound, len(shapes), problem, limits, shape, caps, options))
        shapes.sort(key=lambda s: (s[0], s[1]))
        for position, (bound, index, problem, limits, shape, caps, options) in enumerate(shapes):
            if self.beaten(bound, shape, problem):
                continue
            if self.late(bound):
                self.open_bound_s = min([self.open_bound_s] + [s[0] for s in shapes[position:]])
                return
            self.expand_shape(problem, limits, shape, caps, options, index, bound)
            if self.open_bound_s < math.inf:  # the deadline passed inside the shape
                self.open_bound_s = min([self.open_bound_s] + [s[0] for s in shapes[position:]])
                return

    def expand_shape(self, problem: Problem, limits: _Bounds, shape: Shape,
                     caps: dict[str, int], options: list[Switches], index: int,
                     shape_bound: float) -> None:
        """Expand the shape's assignments best bound first; when there are more than
        SORTED_ASSIGNMENTS (many groups, deep pipelines) in the order they are generated
        (fewest groups first), each still skipped when its bound is beaten."""
        m = shape.num_microbatches(problem.training.global_batch)
        fast = [_settings(problem, shape, sw) for sw in _by_sp(options)]
        generated = enumerate(assignments(caps, shape.pp))
        ranked = []
        for number, assignment in generated:
            if self.late(shape_bound):
                return
            ranked.append((self.assignment_bound(limits, fast, assignment, m), number, assignment))
            if len(ranked) == SORTED_ASSIGNMENTS:
                break
        else:
            ranked.sort()
        for bound, number, assignment in ranked:
            self.try_assignment(problem, limits, shape, assignment, options, m, (index, number),
                                bound, shape_bound)
        for number, assignment in generated:
            bound = self.assignment_bound(limits, fast, assignment, m)
            self.try_assignment(problem, limits, shape, assignment, options, m, (index, number),
                                bound, shape_bound)
            if self.open_bound_s < math.inf:
                return

    @staticmethod
    def assignment_bound(limits: _Bounds, fast: list[Plan], assignment: Assignment,
                         m: int) -> float:
        groups = stage_groups(assignment)
        return min(limits.assignment_bound(plan, Recompute.NONE, groups, m) for plan in fast)

    def try_assignment(self, problem: Problem, limits: _Bounds, shape: Shape,
                       assignment: Assignment, options: list[Switches], m: int,
                       where: tuple[int, int], bound: float, shape_bound: float) -> None:
        if self.open_bound_s < math.inf or self.beaten(bound, shape, problem):
            return
        if self.late(shape_bound):  # the shape's bound covers its assignments not yet tried
            return
        self.expand_assignment(problem, limits, shape, assignment, options, m, where, bound)

    def expand_assignment(self, problem: Problem, limits: _Bounds, shape: Shape,
                          assignment: Assignment, options: list[Switches], m: int,
                          where: tuple[int, int], assignment_bound: float) -> None:
        """Choose the split for each switch setting whose bound can win; ``where`` (shape and
        assignment numbers in enumeration order) with the switch number and the blocks make the
        stated tie-break."""
        groups = stage_groups(assignment)
        for number, sw in enumerate(options):
            plan = _settings(problem, shape, sw)
            recompute = sw.recompute if sw.recompute_num_layers is None else Recompute.NONE
            bound = limits.assignment_bound(plan, recompute, groups, m)
            if self.beaten(bound, shape, problem):
                continue
            if self.late(assignment_bound):
                return
            best = _best_split(problem, plan, groups, self.pools,
                               lambda step_s: self.beaten(step_s, shape, problem),
                               self.split_unproven)
            if best is None:
                continue
            tokens = problem.training.tokens_per_step
            if not meets_throughput(self.objective, best.step_s, tokens):
                continue
            world = plan.world_size
            order = (self.key(best.step_s, shape, problem), world, shape.tp * shape.pp,
                     best.step_s, where + (number, best.blocks))
            if self.best is None or order < self.best[0]:
                chosen = group_plan(shape, sw, problem.graph, best.blocks, assignment,
                                    problem.training)
                self.best = (order, chosen, problem)


def _by_sp(options: list[Switches]) -> list[Switches]:
    """One switch per SP setting: the bounds depend on nothing else (recompute off)."""
    return list({sw.sp: sw for sw in options}.values())


def _best_split(problem: Problem, plan: Plan, groups: tuple[str, ...], pools: dict,
                beaten, unproven=None) -> _Split | None:
    """The blocks per stage with the least step, every stage within its own group's limit, the
    first lexicographically of equal steps; None when no split fits (or, for alike blocks,
    when ``beaten`` holds for a bound on every split). Alike blocks: the partition model's
    (``partition.best_split_on_groups``, node groups as per-stage speed and capacity;
    ``pools`` keeps the answers of equal stage tables); other models: the best of the menu
    (``space.stage_variants``), as on one kind of GPU."""
    if uniform_blocks(problem.graph):
        found = best_split_on_groups(problem, plan, groups, pools, beaten, unproven)
        return None if found is None else _Split(*found)
    best = None
    for stages in stage_variants(problem.graph, plan.pp, 1):
        costs = [stage_cost(problem, plan, rank, groups, (s.first_layer, s.num_layers))
                 for rank, s in enumerate(stages)]
        if all(c.fits for c in costs):
            step = step_time([c.cost.micro_batch_s for c in costs], [c.after_s for c in costs],
                             plan.num_microbatches)
            found = _Split(step, block_counts(problem.graph, stages))
            best = found if best is None or (step, found.blocks) < (best.step_s, best.blocks) else best
    return best


def _check_group_pins(pins: Pins) -> None:
    """Refuse pins outside the heterogeneous space instead of ignoring them."""
    if pins.vpp not in (None, 1):
        raise ConstraintError(
            f"--vpp {pins.vpp}: on a heterogeneous cluster each pipeline rank runs one chunk on "
            "its node group; leave --vpp unset or 1.")
    if pins.cp not in (None, 1):
        raise ConstraintError(
            f"--cp {pins.cp}: context parallelism is not planned across node groups; leave --cp "
            "unset or 1, or plan on one group (its nodes as a cluster of their own).")
    if pins.placement not in (None, DEFAULT_PLACEMENT):
        raise ConstraintError(
            f"--placement {pins.placement}: on a heterogeneous cluster each stage's ranks are "
            f"consecutive on its group's nodes ({DEFAULT_PLACEMENT}); leave --placement unset.")


def solve_on_groups(problems: list[Problem], pins: Pins, *, time_limit_s: float,
                    objective: Objective | None = None, bounds: Bounds | None = None,
                    max_gpus: int | None = None) -> GroupSolution:
    """The best plan across the node groups of a heterogeneous cluster (see module docstring).

    Raises:
        ConstraintError: pins the space cannot hold (vpp or cp > 1, another rank order).
        InfeasibleError: no plan of the space fits.
        NoPlanInTimeError: the time limit passed before any plan that fits was found.
    """
    start = time.perf_counter()
    _check_group_pins(pins)
    objective = objective or Objective()
    search = _Search(problems, pins, objective, bounds, max_gpus, start + time_limit_s)
    search.run()
    wall = time.perf_counter() - start
    if search.best is None:
        if search.open_bound_s < math.inf:
            raise NoPlanInTimeError(
                f"no plan that fits was found within --time-limit {time_limit_s:g}s on this "
                "heterogeneous cluster; raise the limit or pin more dimensions (tp, pp, dp).")
        raise InfeasibleError(_nothing_fits(problems[0], pins))
    _, plan, problem = search.best
    est = estimate(problem, plan)
    return GroupSolution(plan, est, _info(search, plan, problem, est, wall), problem)


def _info(search: _Search, plan: Plan, problem: Problem, est: Estimate,
          wall: float) -> SolverInfo:
    objective = search.objective
    tokens = problem.training.tokens_per_step
    value, unit = objective_value(objective, est.step_time_s, plan.world_size, tokens,
                                  per_token=search.per_token)
    open_bound_s = min(search.open_bound_s, search.unproven_bound_s)
    if open_bound_s == math.inf:
        status, bound = "OPTIMAL", value
    else:  # the open bound is a step time: a bound in the reported unit only for one batch
        status = "FEASIBLE"
        bound = (min(value, open_bound_s)
                 if objective.primary is ObjectiveTerm.TIME and not search.per_token else 0.0)
    return SolverInfo(status=status, objective=value, bound=bound,
                      gap=max(0.0, (value - bound) / value) if value else 0.0, wall_time_s=wall,
                      objective_terms=tuple(t.value for t in objective.terms),
                      objective_unit=unit)


def _nothing_fits(problem: Problem, pins: Pins) -> str:
    groups = ", ".join(f"{g.name} ({g.num_gpus}x {g.gpu.name}, "
                       f"{min(problem.mem_limit_bytes, g.gpu.memory_bytes) / 2**30:.0f} GiB)"
                       for g in problem.cluster.groups)
    pinned = ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in pins.pinned().items()) or "none"
    return (f"no plan fits on the node groups {groups} under the pins ({pinned}): every split "
            "of the layers over the groups' stages puts some stage over its group's memory "
            "limit, or no shape fits the GPUs and the global batch. Use more or larger GPUs, a "
            "shorter sequence, a smaller model, or unpin dimensions.")
