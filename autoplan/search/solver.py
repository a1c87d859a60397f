"""CP-SAT search for the best plan that fits: fastest by default, or fewest GPUs, or cheapest.

Tabulation (``table.Table``: branch and bound, before the model is built)
    The rows are the candidates the table's best-first search keeps: every shape whose bound
    is below the incumbent, each with the stage split CP-SAT chose for it
    (``partition.PartitionModel``) or its menu layouts, and its switches; see ``table``.

Data
    R eligible rows (fit in memory, reach the throughput), each with its objective keys
    ``key[t][r]`` (TIME: µs of step time, or ps per token when the global batch varies; GPUS:
    GPUs; COST: GPU-ps per token) and its degrees
    ``tp[r], pp[r], dp[r], mbs[r], zero[r], recompute[r], sp[r], vpp[r], offload[r]``.

Decision variables
    ``pick[r]`` (bool): row r is the plan. Pins and bounds need no constraint here: the rows
    are drawn from ``space`` under them.

Constraints (one ``add_<family>`` each, every constraint named)
    1. choice: exactly one pick                                        → add_choice()
    2. lexicographic: ``sum(key[t][r] pick[r]) <= optimum[t]`` for each earlier term
       (``objective_<term>``)                                            → solve_lexicographic()

Objective
    Terms are minimized in order, each solve fixing the earlier terms at their optimum; the
    last minimizes ``sum((key[last][r] * R + tiebreak[r]) pick[r])``: among plans with equal
    keys, the stated tie-break order (fewer GPUs, then fewer GPUs per model replica (tp*pp),
    then less memory, then the candidate order) so the same input gives the same plan
    whatever the number of workers. ``SolverInfo.objective`` is the first term in its unit
    (seconds of step time for time), ``objective_unit`` names it.

The best eligible row is the hint. Status is OPTIMAL only when CP-SAT proves every term; with a
time limit it may be FEASIBLE, reported with the bound. ``search.solve`` runs it all: before
the search ``conflicts.conflict_if_nothing_fits`` answers from each family's memory-leanest
plans whether anything fits at all (seconds even on 8,192 GPUs); when no row is eligible,
``conflicts.explain_conflict`` names the requirements that conflict.
"""

from __future__ import annotations

import logging
import time

from ortools.sat.python import cp_model

<<<<<<< HEAD
from autoplan.costmodels.problem import Problem
from autoplan.plan import one_line
from autoplan.search.table import Table
=======
from autoplan.costmodels.problem import Problem, limit_mib, memory_mib
from autoplan.costmodels.step import estimate, step_and_peak
from autoplan.costmodels.bounds import lower_bound_s, shape_lower_bound_s
from autoplan.degrees import DEGREE, of_plan
from autoplan.plan import (Estimate, Offload, Plan, Recompute, ShapeRunnerUp, one_line)
from autoplan.search.objective import key as objective_key
from autoplan.search.objective import meets_throughput
from autoplan.search.runners_up import best_by_shape
from autoplan.search.space import (
    Shape, family_of, leanest, leanest_members, leanest_plans, make_plan, max_chunk_blocks,
    pipeline_schedule, shapes, stage_variants, switches,
)
from autoplan.training import KNOWN_PLACEMENTS, Bounds, Objective, Pins
>>>>>>> main
from autoplan.units import format_excess, gib_digits

logger = logging.getLogger(__name__)

US = 1e6
<<<<<<< HEAD
=======
DIMENSIONS = tuple(DEGREE)
_CODES = {"recompute": {r: i for i, r in enumerate(Recompute)},
          "offload": {o: i for i, o in enumerate(Offload)},
          "placement": {p: i for i, p in enumerate(sorted(KNOWN_PLACEMENTS))}}
"""The integers that stand for the values of the degrees that are not numbers."""
>>>>>>> main
RANDOM_SEED = 0
PROBING_LEVEL = 0
"""The model is one exactly-one over prepared rows: probing only costs time (1.4 s -> 0.26 s on
9,000 rows) and cannot tighten a bound that the LP relaxation already makes exact."""


<<<<<<< HEAD
=======
def _encoded(name: str, value) -> int:
    """A degree's value as the table's integer (0 for no ``recompute_num_layers``)."""
    return _CODES[name][value] if name in _CODES else int(value or 0)


def _dims_of(plan: Plan) -> dict[str, int]:
    return {name: _encoded(name, value) for name, value in of_plan(plan, DIMENSIONS).items()}


def pin_values(pins: Pins) -> dict[str, int]:
    """Pins in the table's integer encoding."""
    return {name: _encoded(name, value) for name, value in pins.pinned().items()}


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

    @property
    def tp_pp(self) -> tuple[int, int]:
        return self.shape.tp, self.shape.pp


@dataclass
class Table:
    """Evaluated candidate plans with their step time and worst-GPU memory, from one problem
    per allowed global batch (``sources[r]`` names row r's). Full estimates (breakdowns,
    per-stage memory) are computed on demand."""

    problems: list[Problem]
    objective: Objective = field(default_factory=Objective)
    plans: list[Plan] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    peak_bytes: list[float] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    keys: list[tuple] = field(default_factory=list)  # objective key of each row
    eligible_rows: list[bool] = field(default_factory=list)  # fits and fast enough
    open_bound_s: float = math.inf  # lower bound of candidates left unevaluated at the deadline
    unexpanded: list[_Pending] = field(default_factory=list)  # never evaluated (runners-up)
    every_dp: bool = False  # lift the DP dominance even for time (relaxed tables)
    pins: Pins = field(default_factory=Pins)
    screen: bool = True  # drop ZeRO stages whose leanest switches do not fit (exact)
    families: dict = field(default_factory=dict)  # (source, family) -> its memory-leanest shapes
    _family_fits: dict = field(default_factory=dict)  # (source, family, stages) -> any fits
    _created: int = 0

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
              every_dp: bool = False, bound_key: tuple | None = None) -> "Table":
        """Evaluate the candidates best bound first (shapes by their physical bound, then
        their stage layouts by their fastest switches) until the rest cannot win or the
        ``deadline`` (a ``time.perf_counter()`` value) passes; ``prune=False`` evaluates all;
        ``bound_key`` evaluates every candidate whose objective key can be at most it."""
        problems = [problems] if isinstance(problems, Problem) else list(problems)
        table = cls(problems, objective or Objective(), every_dp=every_dp, pins=pins,
                    screen=prune)
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
            return self._stage_groups(item)
        self._expand(item)
        return []

    def _stage_groups(self, item: _Pending) -> list[_Pending]:
        """Evaluate the lower-bound switches of every stage layout of a shape; the layouts
        with their bound and the switches still to evaluate. When pruning, the ZeRO stages
        whose leanest switches do not fit are dropped first (nothing of theirs can fit), and
        a layout where none fits is dropped whole."""
        problem, shape, groups = self.problems[item.source], item.shape, []
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
            fast = [sw for sw in options if _cannot_be_slower(sw)] or options
            bound = min(times[sw] if sw in times else self.add(
                make_plan(shape, sw, stages, problem.training), item.source) for sw in fast)
            rest = [sw for sw in kept if sw not in fast and sw not in times]
            groups.append(self._new_pending(bound, item.source, shape, stages, rest))
        return groups

    def _family_may_fit(self, source: int, shape: Shape, stages: tuple) -> bool:
        """Whether any shape of ``shape``'s family (``leanest_members``) can fit with these
        stages: the leanest switches of each ZeRO stage at the family's memory-leanest shapes,
        evaluated once per family and layout. When none fits, those rows join the table (what
        an explanation of infeasibility reports) and no other member is evaluated: on 8,192
        GPUs this is what makes an infeasible answer come in seconds."""
        key = (source, family_of(shape), stages)
        if key not in self._family_fits:
            problem = self.problems[source]
            lean = leanest_plans(self.families[(source, family_of(shape))], stages,
                                 graph=problem.graph, training=problem.training, pins=self.pins)
            peaks = [step_and_peak(problem, plan)[1] for plan in lean]
            fits = any(memory_mib(peak) <= limit_mib(problem) for peak in peaks)
            if not fits:
                for plan in lean:
                    self.add(plan, source)
            self._family_fits[key] = fits
        return self._family_fits[key]

    def _zero_stages_that_fit(self, item: _Pending, stages: tuple, options: list,
                              times: dict) -> set[int]:
        """Evaluate the leanest switches of each ZeRO stage (their step times into ``times``);
        the stages whose leanest fits."""
        training = self.problems[item.source].training
        fitting = set()
        for zero in sorted({sw.zero for sw in options}):
            lean = leanest([sw for sw in options if sw.zero == zero])
            times[lean] = self.add(make_plan(item.shape, lean, stages, training), item.source)
            if self.fits(len(self) - 1):
                fitting.add(zero)
        return fitting

    def _expand(self, group: _Pending) -> list[int]:
        """Evaluate a stage layout's remaining switches; the rows added."""
        shape, stages, source = group.shape, group.stages, group.source
        training = self.problems[source].training
        start = len(self)
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

    def _smallest_fitting(self, options: list, shape, stages, source: int) -> None:
        """Recomputing N of a chunk's blocks: more N only adds time and only saves memory, so
        the smallest N that fits dominates every other N (exact pruning). Binary search it,
        keeping the rows evaluated on the way."""
        training = self.problems[source].training
        low, high = 0, len(options) - 1
        while low <= high:
            middle = (low + high) // 2
            self.add(make_plan(shape, options[middle], stages, training), source)
            if self.fits(len(self) - 1):
                high = middle - 1
            else:
                low = middle + 1

    def add(self, plan: Plan, source: int = 0) -> float:
        """Evaluate ``plan`` on problem ``source`` into a new row; its step time."""
        problem = self.problems[source]
        step_s, peak = step_and_peak(problem, plan)
        tokens = problem.training.tokens_per_step
        self.plans.append(plan)
        self.step_times_s.append(step_s)
        self.peak_bytes.append(peak)
        self.sources.append(source)
        self.keys.append(self._key(step_s, plan.world_size, tokens))
        self.eligible_rows.append(memory_mib(peak) <= limit_mib(problem) and meets_throughput(
            self.objective, step_s, tokens))
        return step_s

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
        return self.keys[row]

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
            for group in self._process(heapq.heappop(mine)):
                heapq.heappush(mine, group)
            added = [self.key(r) for r in range(start, len(self)) if self.is_eligible(r)]
            best = min([*added, *([best] if best is not None else [])], default=None)
        self.unexpanded += mine
        return list(range(first, len(self)))

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
        first, until no uncompleted shape could enter); ``slower_by`` compares time per token
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
            added = [r for r in self.complete_shape(*shape, known) if self.is_eligible(r)]
            best = best_by_shape([*best.values(), *added], self.plans, self.order)
            done.add(shape)
        per_token = lambda r: self.step_times_s[r] / self.tokens(r)  # noqa: E731
        rows = sorted((best[s] for s in done if s in best), key=self.order)[:count]
        return [ShapeRunnerUp(tp=self.plans[r].tp, pp=self.plans[r].pp, dp=self.plans[r].dp,
                              plan=one_line(self.plans[r]), step_time_s=self.step_times_s[r],
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


def _cannot_be_slower(sw) -> bool:
    """Switches whose time is a lower bound for their shape: recomputation and offload add
    work, ZeRO-3 adds per-micro-batch gathers; ZeRO 0-2 and SP can go either way."""
    return sw.recompute is Recompute.NONE and sw.offload is Offload.NONE and sw.zero < 3


>>>>>>> main
class PlanModel:
    """The CP-SAT model over the fitting rows of one table."""

    def __init__(self, table: Table, rows: list[int]) -> None:
        self.table = table
        self.rows = rows
        self.model = cp_model.CpModel()
        self.pick = [self.model.new_bool_var(f"pick_{r}") for r in rows]
        self.add_choice()
        self.add_objective(last=len(table.objective.terms) == 1)

    def add_choice(self) -> None:
        """Exactly one candidate is the plan."""
        self.model.add_exactly_one(self.pick).with_name("choice")

    def add_objective(self, term: int = 0, *, last: bool = True) -> list[int]:
        """Minimize the objective's ``term``-th key; the last term carries the tie-break rank
        (scaled by the row count) so that the optimum is one row. Returns the coefficients."""
        n = len(self.rows)
        order = sorted(range(n), key=lambda i: self.table.tiebreak_key(self.rows[i]))
        rank = [0] * n
        for position, i in enumerate(order):
            rank[i] = position
        keys = [self.table.key(r)[term] for r in self.rows]
        self.scale = n if last else 1
        coefficients = [k * n + rank[i] for i, k in enumerate(keys)] if last else keys
        self.model.minimize(cp_model.LinearExpr.weighted_sum(self.pick, coefficients))
        return coefficients

    def add_hint(self, row: int) -> None:
        for r, pick in zip(self.rows, self.pick):
            self.model.add_hint(pick, r == row)

    def chosen(self, solver: cp_model.CpSolver) -> int:
        return next(r for r, pick in zip(self.rows, self.pick) if solver.boolean_value(pick))

    def solve(self, time_limit_s: float, num_workers: int = 1) -> tuple[cp_model.CpSolver, int]:
        solver = cp_model.CpSolver()
        solver.parameters.random_seed = RANDOM_SEED
        solver.parameters.cp_model_probing_level = PROBING_LEVEL
        solver.parameters.max_time_in_seconds = time_limit_s
        solver.parameters.num_workers = num_workers
        status = solver.solve(self.model)
        return solver, status

    def solve_lexicographic(self, time_limit_s: float, num_workers: int = 1
                            ) -> tuple[cp_model.CpSolver, int, float]:
        """Minimize the terms in order, each solve fixing the earlier terms at their optimum
        (named constraints ``objective_<term>``). Returns the last solver, the weakest status
        and the proven bound of the first term (in key units)."""
        terms = self.table.objective.terms
        deadline = time.perf_counter() + time_limit_s
        status, first_bound = cp_model.OPTIMAL, 0.0
        for i, term in enumerate(terms):
            last = i == len(terms) - 1
            coefficients = self.add_objective(i, last=last)
            solver, step = self.solve(max(0.1, deadline - time.perf_counter()), num_workers)
            if step not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                return solver, step, first_bound
            if i == 0:
                first_bound = solver.best_objective_bound / self.scale
            status = cp_model.FEASIBLE if step == cp_model.FEASIBLE else status
            if not last:
                self.model.add(cp_model.LinearExpr.weighted_sum(self.pick, coefficients)
                               <= round(solver.objective_value)).with_name(
                                   f"objective_{term.value}")
        return solver, status, first_bound


NO_LEGAL_PLAN = (
    "no legal plan exists for these pins and bounds on this cluster and batch: the pinned "
    "degrees must fit the GPU count (and max_gpus), and the global batch must divide by dp*mbs.")


def explain_infeasible(table: Table, problem: Problem) -> str:
    """Which requirement cannot be met, and by how much."""
    best = min(range(len(table)), key=lambda r: table.peak_bytes[r])
    plan, est = table.plans[best], table.estimate(best)
    stage = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
    kept = (f" (the memory limit less the {problem.headroom:.0%} headroom solve keeps free; "
            "--headroom 0 fills the GPU)" if problem.headroom else "")
    need, limit = est.peak_memory_gib, est.memory_limit_gib
    return (
        f"nothing fits in {limit:.1f} GiB per GPU{kept}: even the leanest of {len(table)} "
        f"candidate plans ({one_line(plan)}) needs {need:.{gib_digits(need, limit)}f} GiB on "
        f"pipeline stage {stage} ({format_excess(need, limit)} over). Use more or larger GPUs, "
        "a shorter sequence, a smaller model, or unpin dimensions that keep memory high."
    )
