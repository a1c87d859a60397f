"""The candidate table: best-first branch and bound over shapes, stage splits and switches.

It supplies the CP-SAT model (``solver``) with its rows, their bounds and its hint.

Candidates come from ``space`` grouped by shape (tp, pp, dp, mbs, vpp) and stage layout, for each
allowed global batch (one problem each), within the user's bounds and GPU budget (``max_gpus``
caps the world the shapes are drawn from). Every objective key (``objective.py``) is
nondecreasing in step time for a fixed shape (its GPUs and tokens per step are fixed), so a lower
bound on a shape's step time bounds its keys, for every objective. Work is taken best bound first
from one queue:
1. a shape, bounded by physics alone (``shape_lower_bound_s``: its layers' compute and TP
   collectives spread evenly over the pipeline with the schedule's bubble), is split into its
   stage layouts. Where the partition model applies (``partition.applies``: blocks alike, a
   pipeline of at most 8 ranks, 4 interleaved) the split is not a menu: for every switch
   setting CP-SAT chooses the blocks of each rank, spread over its chunks
   (``partition.near_optimal_splits``; the best of its near-optimal splits by this table's
   order is the row), and the shape has one layout group whose bound is the fastest
   split of its fast switches with the memory limit ignored. Otherwise the layouts are
   ``space.stage_variants``;
2. a stage layout is bounded by its switches that cannot be slower than the others (no
   recomputation, no offload, ZeRO below 3): recomputation and offload only add time and ZeRO-3
   only adds communication. Before that, the leanest switches of each ZeRO stage
   (``space.leanest``) are evaluated: a ZeRO stage whose leanest does not fit (with any split,
   where CP-SAT chooses it) has nothing that fits, and a layout with no such stage is dropped;
3. a bounded layout is expanded: its remaining switches are evaluated (the smallest fitting
   ``recompute_num_layers`` by binary search on a fixed layout, since it dominates larger ones;
   where CP-SAT chooses the split, every N from the smallest that fits with some split, since a
   larger N may let a better split fit, in order of N while its bound can win, the rest
   queued; the smallest N is searched only once the least bound of its settings comes off the
   queue).
The queue stops when the best bound left is worse than the best eligible row (the rest cannot
hold the optimum) or at the deadline. A bound that already misses ``min_tokens_per_s`` admits no
eligible row either. Under GPUS and COST the time-only dominance of the DP degrees
(``space.dp_options``) is lifted: fewer GPUs can win. Rows over the memory limit or under the
throughput stay in the table (for explanations) but not in the model; ``prune=False`` evaluates
everything (explanations of infeasibility).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field, replace

from autoplan.costmodels.bounds import lower_bound_s, shape_lower_bound_s
from autoplan.costmodels.problem import Problem, limit_mib, memory_mib
from autoplan.costmodels.step import estimate, split_floor_s, step_and_peak, worst_gpu_bytes
from autoplan.errors import InfeasibleError
from autoplan.plan import Estimate, Offload, Plan, Recompute, ShapeRunnerUp, one_line
from autoplan.search.objective import key as objective_key
from autoplan.search.objective import meets_throughput
from autoplan.search.partition import applies, near_optimal_splits, split_fits
from autoplan.search.runners_up import best_by_shape, entry_limit
from autoplan.search.space import (
    Shape, balanced_stages, family_of, leanest, leanest_members, leanest_plans, make_plan,
    max_chunk_blocks, pipeline_schedule, shapes, stage_variants, switches,
)
from autoplan.training import Bounds, Objective, Pins

logger = logging.getLogger(__name__)

RUNNERS_UP = 6
"""Other (TP, PP) shapes a solve reports, best first."""
BOUND_SLACK = 1e-9
"""Relative margin taken off the split bound: its sum is in a different float order."""
SPLIT = ()
"""The ``stages`` of a pending layout group whose split CP-SAT chooses per switch setting."""
UNEXPLAINED = "no plan meeting these requirements fits (the conflict was not explained)"
"""The message where the caller asked only whether a plan fits (``explain=False``; a ZeRO
stage that nothing fits at, ``best_at_zero``)."""
_BEST = object()
"""``_cannot_beat``'s default: the best eligible row so far."""


@dataclass(order=True)
class _Pending:
    """Candidates not evaluated yet, with a bound on their objective key: a whole shape
    (``stages`` None; bound from ``shape_lower_bound_s``) or one stage layout of a shape whose
    fast switches are evaluated (bound: the fastest of them) and the ``rest`` still pending.
    Ordered by bound, then creation order (deterministic)."""

    key: tuple
    order: int
    bound_s: float = field(compare=False)
    source: int = field(compare=False)
    shape: Shape = field(compare=False)
    stages: tuple | None = field(compare=False, default=None)
    rest: list = field(compare=False, default_factory=list)
    deferred: str = field(compare=False, default="")  # how a split the bound put off resumes

    @property
    def tp_pp(self) -> tuple[int, int]:
        return self.shape.tp, self.shape.pp


@dataclass
class Table:
    """Evaluated candidate plans with their step time and worst-GPU memory, from one problem
    per allowed global batch (``sources[r]`` names row r's). A row's memory is priced when it
    is added, its step time (and objective key) where it fits or when asked for
    (``step_time``, ``key``): most rows of a large search do not fit, and their step time
    is wanted only for a bound or an explanation. Full estimates (breakdowns, per-stage
    memory) are computed on demand."""

    problems: list[Problem]
    objective: Objective = field(default_factory=Objective)
    plans: list[Plan] = field(default_factory=list)
    _step_s: list[float | None] = field(default_factory=list)  # None: not priced yet
    peak_bytes: list[float] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    _keys: list[tuple | None] = field(default_factory=list)  # objective key of each row
    eligible_rows: list[bool] = field(default_factory=list)  # fits and fast enough
    open_bound_s: float = math.inf  # lower bound of candidates left unevaluated at the deadline
    unproven_bound_s: float = math.inf  # least step of splits CP-SAT's limit left unproven
    unexpanded: list[_Pending] = field(default_factory=list)  # never evaluated (runners-up)
    every_dp: bool = False  # lift the DP dominance even for time (relaxed tables)
    pins: Pins = field(default_factory=Pins)
    screen: bool = True  # drop ZeRO stages whose leanest switches do not fit (exact)
    choose_splits: bool = True  # CP-SAT chooses the split where partition.applies
    families: dict = field(default_factory=dict)  # (source, family) -> its memory-leanest shapes
    _family_fits: dict = field(default_factory=dict)  # (source, family, stages) -> any fits
    _family_fits_seen: dict = field(default_factory=dict)  # the same by id(stages): see below
    _created: int = 0
    best_key: tuple | None = None  # of the best eligible row so far (what splits must beat)
    completing: tuple[tuple | None] | None = None  # (a shape's best key) while complete_shape runs
    _deferred: list = field(default_factory=list)  # splits put off by their bound, to queue
    _pools: dict = field(default_factory=dict)  # partition stage tables -> their CP-SAT pools
    _applies: dict = field(default_factory=dict)  # (source, pp, vpp) -> partition.applies
    _split_bounds: dict = field(default_factory=dict)  # (source, shape, switches) -> bound s
    _measured: dict = field(default_factory=dict)  # (source, plan) -> step_and_peak
    _rows: set = field(default_factory=set)  # (source, plan) of every row

    @property
    def problem(self) -> Problem:
        return self.problems[0]

    @property
    def per_token(self) -> bool:
        """Step times of different global batches compare only per token."""
        return len({p.training.global_batch for p in self.problems}) > 1

    @classmethod
    def build(cls, problems: Problem | list[Problem], pins: Pins, *, deadline: float = math.inf,
              objective: Objective | None = None, bounds: Bounds | None = None,
              max_gpus: int | None = None, prune: bool = True,
              every_dp: bool = False, bound_key: tuple | None = None,
              choose_splits: bool = True) -> "Table":
        """Evaluate the candidates best bound first (shapes by their physical bound, then
        their stage layouts by their fastest switches) until the rest cannot win or the
        ``deadline`` (a ``time.perf_counter()`` value) passes; ``prune=False`` evaluates all;
        ``bound_key`` evaluates every candidate whose objective key can be at most it;
        ``choose_splits`` False keeps the ``stage_variants`` menu everywhere (what the
        partition benchmark compares against)."""
        problems = [problems] if isinstance(problems, Problem) else list(problems)
        table = cls(problems, objective or Objective(), every_dp=every_dp, pins=pins,
                    screen=prune, choose_splits=choose_splits)
        pending = [item for source in range(len(problems))
                   for item in table._shape_bounds(source, pins, bounds, max_gpus, deadline)]
        heapq.heapify(pending)
        best, shapes_bounded, processed = None, len(pending), 0
        stop = "the queue emptied: every candidate was evaluated"
        while pending:
            item = pending[0]
            limit = best if bound_key is None else bound_key
            if prune and limit is not None and item.key > limit:
                stop = "the best bound left is worse than the best plan found"
                break
            if time.perf_counter() > deadline:
                table.open_bound_s = min(table.open_bound_s, *(p.bound_s for p in pending))
                stop = "the time limit passed"
                break
            heapq.heappop(pending)
            processed += 1
            start = len(table)
            for group in table._process(item):
                heapq.heappush(pending, group)
            best = min([table.key(r) for r in range(start, len(table)) if table.is_eligible(r)]
                       + ([best] if best is not None else []), default=None)
        table.unexpanded = pending
        _log_search(table, shapes_bounded, processed, stop)
        return table

    def _new_pending(self, bound_s: float, source: int, shape: Shape, stages=None,
                     rest=()) -> _Pending:
        world = shape.tp * shape.pp * shape.dp * shape.cp
        tokens = self.problems[source].training.tokens_per_step
        self._created += 1
        return _Pending(self._key(bound_s, world, tokens), self._created, bound_s, source, shape,
                        stages, list(rest))

    def _shape_bounds(self, source: int, pins: Pins, bounds: Bounds | None,
                      max_gpus: int | None, deadline: float) -> list[_Pending]:
        """Every legal shape of one problem with its physical bound, nothing evaluated yet
        (shapes not reached by the ``deadline`` are bounded by physics alone)."""
        problem = self.problems[source]
        world = min(problem.cluster.num_gpus, max_gpus or problem.cluster.num_gpus)
        batch = problem.training.global_batch
        items = []
        for shape in shapes(problem.graph, world=world,
                            gpus_per_node=problem.cluster.gpus_per_node,
                            training=problem.training, pins=pins, bounds=bounds,
                            every_dp=self.every_dp or self.objective.needs_every_dp):
            if time.perf_counter() > deadline:
                self.open_bound_s = min(self.open_bound_s, lower_bound_s(problem))
                break
            bound = shape_lower_bound_s(
                problem, tp=shape.tp, pp=shape.pp, cp=shape.cp, mbs=shape.mbs, vpp=shape.vpp,
                num_microbatches=shape.num_microbatches(batch),
                zero_bubble=pipeline_schedule(problem.training.runtime, shape.vpp) is not None)
            items.append(self._new_pending(bound, source, shape))
        for family, members in leanest_members(item.shape for item in items).items():
            self.families[(source, family)] = members
        return items

    def _process(self, item: _Pending) -> list[_Pending]:
        """Evaluate a pending item: a shape yields its stage layouts (fast switches evaluated,
        the rest pending); a stage layout is expanded."""
        if item.stages is None:
            groups = self._stage_groups(item)
        else:
            self._expand(item)
            groups = []
        groups += self._deferred
        self._deferred = []
        return groups

    def _stage_groups(self, item: _Pending) -> list[_Pending]:
        """Evaluate the lower-bound switches of every stage layout of a shape; the layouts
        with their bound and the switches still to evaluate. When pruning, the ZeRO stages
        whose leanest switches do not fit are dropped first (nothing of theirs can fit), and
        a layout where none fits is dropped whole."""
        problem, shape, groups = self.problems[item.source], item.shape, []
        if self._chooses_split(item.source, shape):
            return self._split_group(item)
        for stages in stage_variants(problem.graph, shape.pp, shape.vpp):
            if self.screen and not self._family_may_fit(item.source, shape, stages):
                continue
            options = switches(shape, runtime=problem.training.runtime, pins=self.pins,
                               blocks_per_chunk=max_chunk_blocks(problem.graph, stages))
            times: dict = {}
            kept = options
            if self.screen:
                fitting = self._zero_stages_that_fit(item, stages, options, times)
                if not fitting:
                    continue
                kept = [sw for sw in options if sw.zero in fitting]
            fast = fastest_switches(options)
            bound = min(self.step_time(times[sw] if sw in times else self.add(
                make_plan(shape, sw, stages, problem.training), item.source)) for sw in fast)
            rest = [sw for sw in kept if sw not in fast and sw not in times]
            groups.append(self._new_pending(bound, item.source, shape, stages, rest))
        return groups

    def _chooses_split(self, source: int, shape: Shape) -> bool:
        """Whether CP-SAT chooses this shape's split (``partition.applies``, once per pipeline
        shape: it compares every block of the graph)."""
        key = (source, shape.pp, shape.vpp)
        if key not in self._applies:
            self._applies[key] = self.choose_splits and applies(self.problems[source], shape.pp,
                                                                shape.vpp)
        return self._applies[key]

    def _split_group(self, item: _Pending) -> list[_Pending]:
        """``_stage_groups`` where CP-SAT chooses the split: the shape's one layout group
        (``stages`` SPLIT), bounded by the fluid bound of its fast switches (``split_bound``);
        the leanest switches of each ZeRO stage screen as on a fixed layout, each fitting when
        some split fits."""
        problem, shape, source = self.problems[item.source], item.shape, item.source
        if self.screen and not self._family_may_fit(source, shape, SPLIT):
            return []
        options = self._split_switches(problem, shape)
        kept, done = options, set()
        if self.screen:
            fitting = set()
            for zero in sorted({sw.zero for sw in options}):
                lean = leanest([sw for sw in options if sw.zero == zero])
                done.add(lean)
                if self.add_split(shape, lean, source, screen=True):
                    fitting.add(zero)
            if not fitting:
                return []
            kept = [sw for sw in options if sw.zero in fitting]
        fast = fastest_switches(options)
        bound = min(self.split_bound(shape, sw, source) for sw in fast)
        rest = [sw for sw in kept if sw not in done]
        return [self._new_pending(bound, source, shape, SPLIT, rest)]

    def _split_switches(self, problem: Problem, shape: Shape) -> list:
        """The switches of a shape whose split CP-SAT chooses: those of its balanced layout
        (the partial-recompute counts up to its largest stage), as ``space.split_plans``."""
        balanced = balanced_stages(problem.graph, shape.pp, shape.vpp)
        return switches(shape, runtime=problem.training.runtime, pins=self.pins,
                        blocks_per_chunk=max_chunk_blocks(problem.graph, balanced))

    def _template(self, shape: Shape, sw, source: int) -> Plan:
        problem = self.problems[source]
        return make_plan(shape, sw, balanced_stages(problem.graph, shape.pp, shape.vpp),
                         problem.training)

    def split_bound(self, shape: Shape, sw, source: int) -> float:
        """Least step of ``shape`` and ``sw`` over every split, memory aside
        (``step.split_floor_s``: the fluid 1F1B bound plus a floor under what follows the
        drain)."""
        key = (source, shape, sw)
        if key not in self._split_bounds:
            problem, template = self.problems[source], self._template(shape, sw, source)
            self._split_bounds[key] = split_floor_s(problem, template) * (1 - BOUND_SLACK)
        return self._split_bounds[key]

    def _cannot_beat(self, bound_s: float, shape: Shape, source: int, best=_BEST) -> bool:
        """Whether a bound of ``shape``'s step is worse than ``best`` (default: the best
        eligible row), or no row is eligible yet: its split waits in the queue."""
        world = shape.tp * shape.pp * shape.dp * shape.cp
        tokens = self.problems[source].training.tokens_per_step
        best = self.best_key if best is _BEST else best
        return best is None or self._key(bound_s, world, tokens) > best

    def add_split(self, shape: Shape, sw, source: int, *, screen: bool = False,
                  balanced: bool = True) -> bool:
        """Add the rows of ``shape`` and ``sw``: the balanced layout (``balanced``), and the
        split CP-SAT chooses (of its near-optimal splits, the first best in this table's order)
        unless the bound over every split cannot beat the best eligible row: then the split is
        queued under that bound (``deferred``, for runners-up). Whether a split fits
        (``screen``: decided even where the bound defers the split)."""
        problem, template = self.problems[source], self._template(shape, sw, source)
        fits = False
        if balanced:
            fits = self.fits(self.add(template, source))
        bound = self.split_bound(shape, sw, source)
        if balanced and self._cannot_beat(bound, shape, source):
            self._defer(bound, source, shape, [sw])
            return fits or screen and split_fits(problem, template)
        splits = near_optimal_splits(problem, template, cache=self._pools,
                                     unproven=self._split_unproven)
        if splits:
            training = problem.training
            plans = [make_plan(shape, sw, stages, training) for stages in splits]
            best = min(plans, key=lambda plan: self._plan_order(plan, source))
            if (source, best) not in self._rows:
                self.add(best, source)
        return fits or bool(splits)

    def _split_unproven(self, floor_s: float) -> None:
        """A split CP-SAT did not prove optimal: the table's best is then proven only down to
        the step no split of that shape is below."""
        self.unproven_bound_s = min(self.unproven_bound_s, floor_s)

    def _defer(self, bound_s: float, source: int, shape: Shape, options: list,
               how: str = "chain") -> None:
        """Queue the splits of ``options`` (switch settings of ``shape``) under ``bound_s``:
        to solve in turn (``how`` "chain") or, partial-recompute settings, to search first for
        the smallest N that fits ("search")."""
        self._deferred.append(self._new_pending(bound_s, source, shape, SPLIT, options))
        self._deferred[-1].deferred = how

    def _split_chain(self, shape: Shape, source: int, options: list) -> None:
        """Solve the splits of partial-recompute settings that differ only in N (fewest first)
        while their bound can beat the best row: the bound grows with N (more blocks recomputed,
        more time on every rank), so from the first that cannot, none can, and the rest wait
        in the queue as one item under that bound. No balanced rows: the split solved for N
        is at least as good as N's balanced layout, and a bound that cannot win covers it."""
        for index, sw in enumerate(options):
            bound = self.split_bound(shape, sw, source)
            if self._cannot_beat(bound, shape, source):
                self._defer(bound, source, shape, options[index:])
                return
            self.add_split(shape, sw, source, balanced=False)

    def _plan_order(self, plan: Plan, source: int) -> tuple:
        """Where ``plan`` would sit in this table's order among plans of its shape: eligible
        first, then the objective key, then memory."""
        problem = self.problems[source]
        step_s, peak = self._measure(plan, source)
        tokens = problem.training.tokens_per_step
        eligible = memory_mib(peak) <= limit_mib(problem) and meets_throughput(
            self.objective, step_s, tokens)
        return not eligible, self._key(step_s, plan.world_size, tokens), peak

    def _family_may_fit(self, source: int, shape: Shape, stages: tuple) -> bool:
        """Whether any shape of ``shape``'s family (``leanest_members``) can fit with these
        stages: the leanest switches of each ZeRO stage at the family's memory-leanest shapes,
        evaluated once per family and layout. When none fits, those rows join the table (what
        an explanation of infeasibility reports) and no other member is evaluated: on 8,192
        GPUs this is what makes an infeasible answer come in seconds."""
        seen = self._family_fits_seen.get((source, family_of(shape), id(stages)))
        if seen is not None and seen[0] is stages:  # hashing a deep layout's stage records
            return seen[1]  # is most of the lookup; equal layouts are mostly the same tuple
        key = (source, family_of(shape), stages)
        if key not in self._family_fits:
            problem = self.problems[source]
            layout = (balanced_stages(problem.graph, shape.pp, shape.vpp) if stages is SPLIT
                      else stages)
            lean = leanest_plans(self.families[(source, family_of(shape))], layout,
                                 graph=problem.graph, training=problem.training, pins=self.pins)
            fits = any(self._may_fit(problem, plan, stages is SPLIT) for plan in lean)
            if not fits:
                for plan in lean:
                    self.add(plan, source)
            self._family_fits[key] = fits
        self._family_fits_seen[(source, family_of(shape), id(stages))] = (stages,
                                                                          self._family_fits[key])
        return self._family_fits[key]

    @staticmethod
    def _may_fit(problem: Problem, plan: Plan, any_split: bool) -> bool:
        """Whether ``plan`` fits, on its own stages or (``any_split``) on some split."""
        if any_split:
            return split_fits(problem, plan)
        return memory_mib(worst_gpu_bytes(problem, plan)) <= limit_mib(problem)

    def _zero_stages_that_fit(self, item: _Pending, stages: tuple, options: list,
                              times: dict) -> set[int]:
        """Evaluate the leanest switches of each ZeRO stage (their rows into ``times``); the
        stages whose leanest fits."""
        training = self.problems[item.source].training
        fitting = set()
        for zero in sorted({sw.zero for sw in options}):
            lean = leanest([sw for sw in options if sw.zero == zero])
            times[lean] = self.add(make_plan(item.shape, lean, stages, training), item.source)
            if self.fits(times[lean]):
                fitting.add(zero)
        return fitting

    def _expand(self, group: _Pending) -> list[int]:
        """Evaluate a stage layout's remaining switches; the rows added."""
        shape, stages, source = group.shape, group.stages, group.source
        training = self.problems[source].training
        start = len(self)
        if stages is SPLIT:
            self._expand_split(group)
            return list(range(start, len(self)))
        partial: dict[tuple, list] = {}
        for sw in group.rest:
            if sw.recompute_num_layers is None:
                self.add(make_plan(shape, sw, stages, training), source)
            else:
                partial.setdefault((sw.zero, sw.sp, sw.offload), []).append(sw)
        for options in partial.values():
            self._smallest_fitting(sorted(options, key=lambda sw: sw.recompute_num_layers),
                                   shape, stages, source)
        return list(range(start, len(self)))

    def _expand_split(self, group: _Pending) -> None:
        """``_expand`` where CP-SAT chooses each switch setting's split. Partial recompute
        (settings that differ only in N): ``_partial_splits``."""
        shape, source = group.shape, group.source
        if group.deferred == "chain":
            self.add_split(shape, group.rest[0], source, balanced=False)
            self._split_chain(shape, source, group.rest[1:])
            return
        if group.deferred == "search":  # its bound came off the queue: search now
            self._partial_splits(shape, source, group.rest, searched_now=True)
            return
        partial: dict[tuple, list] = {}
        for sw in group.rest:
            if sw.recompute_num_layers is None:
                self.add_split(shape, sw, source)
            else:
                partial.setdefault((sw.zero, sw.sp, sw.offload), []).append(sw)
        for options in partial.values():
            self._partial_splits(shape, source,
                                 sorted(options, key=lambda sw: sw.recompute_num_layers))

    def _partial_splits(self, shape: Shape, source: int, options: list,
                        searched_now: bool = False) -> None:
        """Splits of partial-recompute settings that differ only in N (fewest first). Below
        the smallest N that fits with some split nothing fits (less recompute, more memory,
        whatever the split), found by binary search (``partition.split_fits``, no model);
        every larger N may let a faster split fit (``_split_chain``). Where even the fewest
        N's bound (the least: bounds grow with N) cannot beat the best row, nothing is
        searched (unless ``searched_now``): the settings wait in the queue under that bound.
        The search runs only over the N whose bound can beat the best row; where the last of
        those does not fit, none does, and the larger N wait in the queue under their least
        bound."""
        bound = self.split_bound(shape, options[0], source)
        if not searched_now and self._cannot_beat(bound, shape, source):
            self._defer(bound, source, shape, options, "search")
            return
        problem = self.problems[source]
        last = self._last_that_can_win(shape, source, options)
        if 0 <= last < len(options) - 1 and not split_fits(
                problem, self._template(shape, options[last], source)):
            later = options[last + 1:]  # nothing up to ``last`` fits; the rest cannot win now
            self._defer(self.split_bound(shape, later[0], source), source, shape, later, "search")
            return
        low, high = 0, last if last >= 0 else len(options) - 1
        while low <= high:
            middle = (low + high) // 2
            if split_fits(problem, self._template(shape, options[middle], source)):
                high = middle - 1
            else:
                low = middle + 1
        self._split_chain(shape, source, options[low:])

    def _last_that_can_win(self, shape: Shape, source: int, options: list) -> int:
        """The last of ``options`` (partial-recompute settings, fewest N first) whose split
        bound can beat the best row (while a shape is completed for the runners-up: that
        shape's best), -1 if none: the bounds grow with N, so binary search."""
        best = self.best_key if self.completing is None else self.completing[0]
        low, high = 0, len(options) - 1
        while low <= high:
            middle = (low + high) // 2
            bound = self.split_bound(shape, options[middle], source)
            if self._cannot_beat(bound, shape, source, best):
                high = middle - 1
            else:
                low = middle + 1
        return high

    def _smallest_fitting(self, options: list, shape, stages, source: int) -> None:
        """Recomputing N of a chunk's blocks: more N only adds time and only saves memory, so
        the smallest N that fits dominates every other N (exact pruning). Binary search it,
        keeping the rows evaluated on the way."""
        training = self.problems[source].training
        low, high = 0, len(options) - 1
        while low <= high:
            middle = (low + high) // 2
            if self.fits(self.add(make_plan(shape, options[middle], stages, training), source)):
                high = middle - 1
            else:
                low = middle + 1

    def add(self, plan: Plan, source: int = 0) -> int:
        """Evaluate ``plan`` on problem ``source`` into a new row (its step time only where
        it fits); the row."""
        problem = self.problems[source]
        found = self._measured.get((source, plan))
        peak = found[1] if found is not None else worst_gpu_bytes(problem, plan)
        self._rows.add((source, plan))
        self.plans.append(plan)
        self._step_s.append(None)
        self._keys.append(None)
        self.peak_bytes.append(peak)
        self.sources.append(source)
        row = len(self.plans) - 1
        fits = memory_mib(peak) <= limit_mib(problem)
        self.eligible_rows.append(fits and meets_throughput(
            self.objective, self.step_time(row), problem.training.tokens_per_step))
        if self.eligible_rows[-1] and (self.best_key is None or self.key(row) < self.best_key):
            self.best_key = self.key(row)
        return row

    def step_time(self, row: int) -> float:
        """The step seconds of ``row``, priced on first ask."""
        if self._step_s[row] is None:
            self._step_s[row] = self._measure(self.plans[row], self.sources[row])[0]
        return self._step_s[row]

    @property
    def step_times_s(self) -> list[float]:
        """Every row's step seconds (each priced if it was not)."""
        return [self.step_time(row) for row in range(len(self))]

    def _measure(self, plan: Plan, source: int) -> tuple[float, float]:
        """``step_and_peak``, once per plan: a split's near-optimal plans are measured to pick
        one, and the one picked becomes a row."""
        key = (source, plan)
        if key not in self._measured:
            self._measured[key] = step_and_peak(self.problems[source], plan)
        return self._measured[key]

    def __len__(self) -> int:
        return len(self.plans)

    def estimate(self, row: int) -> Estimate:
        return estimate(self.problems[self.sources[row]], self.plans[row])

    def tokens(self, row: int) -> int:
        return self.problems[self.sources[row]].training.tokens_per_step

    def _key(self, step_s: float, world: int, tokens: int) -> tuple[int, ...]:
        return objective_key(self.objective, step_s, world, tokens, per_token=self.per_token)

    def key(self, row: int) -> tuple[int, ...]:
        """The objective's integer key of ``row`` (smaller is better)."""
        if self._keys[row] is None:
            self._keys[row] = self._key(self.step_time(row), self.plans[row].world_size,
                                        self.tokens(row))
        return self._keys[row]

    def fits(self, row: int) -> bool:
        return memory_mib(self.peak_bytes[row]) <= limit_mib(self.problem)

    def is_eligible(self, row: int) -> bool:
        """Fits in memory and reaches the required throughput."""
        return self.eligible_rows[row]

    def fitting(self) -> list[int]:
        """Rows within the memory limit, in table order."""
        return [r for r in range(len(self)) if self.fits(r)]

    def eligible(self) -> list[int]:
        """Rows the model chooses among: fitting and fast enough, in table order."""
        return [r for r, eligible in enumerate(self.eligible_rows) if eligible]

    def tiebreak_key(self, row: int) -> tuple:
        """(GPUs used, tp*pp, memory, candidate order): the stated tie-break."""
        plan = self.plans[row]
        return plan.world_size, plan.tp * plan.pp, self.peak_bytes[row], row

    def order(self, row: int) -> tuple:
        """The solver's total order: objective key, then the tie-break."""
        return self.key(row) + self.tiebreak_key(row)

    def complete_shape(self, tp: int, pp: int, best: tuple | None = None) -> list[int]:
        """Evaluate the pending candidates of one (tp, pp) shape, best bound first, until none
        could beat ``best`` (the shape's best eligible key so far), so that per-shape answers
        (runners-up) are exact. Returns the rows added."""
        mine = [p for p in self.unexpanded if p.tp_pp == (tp, pp)]
        self.unexpanded = [p for p in self.unexpanded if p.tp_pp != (tp, pp)]
        heapq.heapify(mine)
        first = len(self)
        while mine and (best is None or mine[0].key <= best):
            start = len(self)
            self.completing = (best,)
            for group in self._process(heapq.heappop(mine)):
                heapq.heappush(mine, group)
            added = [self.key(r) for r in range(start, len(self)) if self.is_eligible(r)]
            best = min([*added, *([best] if best is not None else [])], default=None)
        self.completing = None
        self.unexpanded += mine
        return list(range(first, len(self)))

    def best_at_zero(self, zero: int, deadline: float = math.inf) -> tuple["Table", int] | None:
        """The plan a search pinned to ZeRO stage ``zero`` chooses, as (a copy of this table,
        its row), or None where the copy cannot tell it the same way.

        The pinned search's candidates are this table's at that stage, and its order the same
        (objective key, then the tie-break), so its choice is the best eligible row at that
        stage once every candidate whose bound could beat it is evaluated: the pending items
        are completed best bound first with the stage pinned (their switches at other stages
        left out), until the least bound left is worse, as ``complete_shape`` does for one
        shape. Done on a copy, so that this table's runners-up stay what they were; the caches
        of pure results are shared. None (the caller then searches with the stage pinned):
        this search or the copy's stopped at a deadline, or two different plans tie in
        everything but the candidate order, which differs between the two searches.

        Raises:
            InfeasibleError: every candidate at that stage was evaluated and none is eligible
                (what the pinned search would raise, unexplained as it is there).
        """
        if self.open_bound_s < math.inf:
            return None
        fork = self._fork(self.pins.model_copy(update={"zero": zero}))
        best = fork._best_row_at_zero(zero, range(len(fork)), None)
        pending = [p for p in (fork._at_zero(item, zero) for item in fork.unexpanded) if p]
        heapq.heapify(pending)
        while pending and (best is None or pending[0].key <= fork.key(best)):
            if time.perf_counter() > deadline:
                return None
            start = len(fork)
            limit = None if best is None else fork.key(best)
            fork.best_key, fork.completing = limit, (limit,)
            for group in fork._process(heapq.heappop(pending)):
                if (group := fork._at_zero(group, zero)) is not None:
                    heapq.heappush(pending, group)
            best = fork._best_row_at_zero(zero, range(start, len(fork)), best)
        if best is None:
            raise InfeasibleError(UNEXPLAINED)
        return None if fork._tied(best, zero) else (fork, best)

    def _fork(self, pins: Pins) -> "Table":
        """A copy to search further in under ``pins``, leaving this table as it is (the caches
        of pure results, measurements, split bounds and pools, are shared)."""
        return replace(self, pins=pins, plans=list(self.plans), _step_s=list(self._step_s),
                       peak_bytes=list(self.peak_bytes), sources=list(self.sources),
                       _keys=list(self._keys), eligible_rows=list(self.eligible_rows),
                       unexpanded=list(self.unexpanded), families=dict(self.families),
                       _family_fits=dict(self._family_fits),
                       _family_fits_seen=dict(self._family_fits_seen),
                       _deferred=list(self._deferred),
                       _rows=set(self._rows))

    @staticmethod
    def _at_zero(item: _Pending, zero: int) -> _Pending | None:
        """A pending item with only its switches at ZeRO stage ``zero`` (a whole shape as it
        is: its layouts are cut when it is split); None when nothing is left."""
        if item.stages is None:
            return item
        rest = [sw for sw in item.rest if sw.zero == zero]
        return replace(item, rest=rest) if rest else None

    def _best_row_at_zero(self, zero: int, rows, best: int | None) -> int | None:
        """The best eligible row at ZeRO stage ``zero`` among ``rows`` and ``best``."""
        found = [r for r in rows if self.is_eligible(r) and self.plans[r].zero_stage == zero]
        return min([*found, *([best] if best is not None else [])], key=self.order,
                   default=None)

    def _tied(self, row: int, zero: int) -> bool:
        """Whether another plan at ZeRO stage ``zero`` ties ``row`` in all of the order but
        the candidate order."""
        tie = self.order(row)[:-1]
        return any(self.plans[r] != self.plans[row] and self.order(r)[:-1] == tie
                   for r in range(len(self)) if self.is_eligible(r)
                   and self.plans[r].zero_stage == zero)

    def _optimistic_shapes(self, mine: tuple[int, int],
                           best: dict[tuple[int, int], int]) -> dict[tuple[int, int], tuple]:
        """For every other (tp, pp) shape, the best key it could still reach: its best
        evaluated eligible row (``best``) or the bound of candidates not yet evaluated."""
        keys = {shape: self.key(row) for shape, row in best.items()}
        for item in self.unexpanded:
            keys[item.tp_pp] = min(keys.get(item.tp_pp, item.key), item.key)
        keys.pop(mine, None)
        return keys

    def runners_up(self, chosen: int, count: int = RUNNERS_UP) -> list[ShapeRunnerUp]:
        """The ``count`` best other (TP, PP) shapes, each with its best eligible plan under the
        objective, best first (exact: a shape is completed before it is ranked, best bound
        first, until no uncompleted shape could enter; a shape is completed only as far as it
        could still enter: ``entry_limit``); ``slower_by`` compares time per token
        (step time when the batch is fixed)."""
        mine = (self.plans[chosen].tp, self.plans[chosen].pp)
        best = best_by_shape(self.eligible(), self.plans, self.order)
        done: set[tuple[int, int]] = set()
        while True:
            optimistic = self._optimistic_shapes(mine, best)
            pending = sorted((s for s in optimistic if s not in done), key=optimistic.get)
            exact = sorted(optimistic[s] for s in done if s in optimistic)
            if not pending or (len(exact) >= count and exact[count - 1] <= optimistic[pending[0]]):
                break
            shape = pending[0]
            known = self.key(best[shape]) if shape in best else None
            added = [r for r in self.complete_shape(*shape, entry_limit(known, exact, count))
                     if self.is_eligible(r)]
            best = best_by_shape([*best.values(), *added], self.plans, self.order)
            done.add(shape)
        per_token = lambda r: self.step_time(r) / self.tokens(r)  # noqa: E731
        rows = sorted((best[s] for s in done if s in best), key=self.order)[:count]
        return [ShapeRunnerUp(tp=self.plans[r].tp, pp=self.plans[r].pp, dp=self.plans[r].dp,
                              plan=one_line(self.plans[r]), step_time_s=self.step_time(r),
                              slower_by=per_token(r) / per_token(chosen) - 1) for r in rows]


def _log_search(table: "Table", shapes_bounded: int, processed: int, stop: str) -> None:
    """What the branch and bound did (``autoplan --verbose``)."""
    left = table.unexpanded
    logger.info("bounded %d shapes by physics; took %d shapes or stage layouts off the queue "
                "(%d rows evaluated, %d eligible)", shapes_bounded, processed, len(table),
                sum(table.eligible_rows))
    logger.info("pruned %d never expanded (%d whole shapes, %d stage layouts); stopped because "
                "%s", len(left), sum(p.stages is None for p in left),
                sum(p.stages is not None for p in left), stop)


def fastest_switches(options: list) -> list:
    """The switches of a layout whose least time bounds all of its options: recomputation
    and offload only add work and ZeRO-3 only adds per-micro-batch gathers, so those without
    recomputation or offload below ZeRO-3, or, where every option is ZeRO-3 (pinned), those
    without recomputation or offload; SP can go either way. All of them otherwise."""
    lean = [sw for sw in options if sw.recompute is Recompute.NONE and sw.offload is Offload.NONE]
    below = [sw for sw in lean if sw.zero < 3]
    if below:
        return below
    return lean or options if all(sw.zero == 3 for sw in options) else options
