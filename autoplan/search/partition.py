"""CP-SAT choice of the layer-to-stage partition: how many transformer blocks each pipeline stage
runs, for one shape and one setting of the switches, in the steps of OR-Tools'
``examples/python/line_balancing_sat.py`` (read the problem, a greedy hint, the model, solve,
re-evaluate the answer).

Read problem
    B blocks over p stages (one chunk per rank, vpp = 1), m micro-batches. For stage s running c
    blocks (the embedding with the first, the final norm, head and loss with the last) the cost
    model (``costmodels.step.rank_profile``) gives, in whole ns, its micro-batch time
    ``t[s][c]`` and what it adds after the pipeline drains ``e[s][c]`` (its gradient reduction
    and optimizer step), and its memory against the limit (whole MiB, as the table compares).
    A stage's costs then depend on its position and count only, which holds when all blocks are
    alike (``uniform``): the model is built for those; other models keep the menu of
    ``space.stage_variants`` (``space.split_is_chosen``). A stage's counts run up to the
    largest that fits and, with m > 1, whose ``t[s][c]`` is at most the slowest stage the
    hint's objective allows (below; binary search, both grow with c), and down to what the
    other stages' largest leave.
Greedy hint
    The balanced split (``space.balanced_stages``), when its counts are in the table; its
    objective caps the slowest stage: (m - 1) T + S + E <= hint, with S = sum t the same for
    every split (alike blocks), gives T <= (hint - S) / (m - 1), so larger counts cannot be in
    a better answer.

Decision variables
    ``x[s][c]`` (bool): stage s runs c blocks; T the slowest stage, E the largest post-drain
    term (integers, ns).

Constraints (one ``add_<family>`` each, every constraint named)
    1. one count per stage: ``sum_c x[s][c] == 1``                      → add_one_count()
    2. composition: ``sum_s sum_c c x[s][c] == B``                      → add_composition()
    3. memory: ``x[s][c] == 0`` where stage s with c blocks is over the limit → add_memory()
    4. slowest: ``T == max_s sum_c t[s][c] x[s][c]``, ``E == max_s sum_c e[s][c] x[s][c]``
                                                                         → add_slowest()

Objective
    ``(m - 1) T + sum_s sum_c t[s][c] x[s][c] + E``: 1F1B (``costmodels.pipeline``) plus the
    slowest post-drain term, the step as ``costmodels.groups`` writes it for node groups.

Solve and re-evaluate
    Skipped where the hint is provably alone in the window (``hint_is_alone``: any other
    split gives some stage one block more, which already costs more than the window). One
    worker, a fixed seed and a deterministic time limit (same input, same partition; past
    it the best split found, at worst the hint). The integer objective differs
    from ``estimate()``'s float step by the rounding of each term and by the post-drain term
    (which ``estimate()`` takes from the rank with most parameters rather than stage by stage),
    so every solution within ``WINDOW`` of the optimum is enumerated (at most ``POOL`` of them)
    and re-evaluated with ``step_and_peak``; the fastest in whole µs, then least memory, then the
    lexicographically first counts, is the answer (the table's and the brute force's order).
    ``tests/search/test_partition.py`` checks it against every composition on small cases.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.search.cpsat import cp_model

from autoplan.costmodels.problem import Problem, limit_mib, memo, memory_mib
from autoplan.costmodels.step import rank_memory_bytes, rank_profile
from autoplan.graph.layer_graph import LayerGraph
from autoplan.plan import Plan, Stage
from autoplan.search.space import (
    balanced_stages, block_counts, split_is_chosen, stages_of_counts,
)

NS = 1e9
RANDOM_SEED = 0
POOL = 64
"""Most near-optimal partitions re-evaluated in floats."""
WINDOW = 0.002
"""Share of the optimum within which partitions are re-evaluated: the post-drain term that the
model takes stage by stage is a few per mille of a step where the split moves it."""
DETERMINISTIC_LIMIT = 0.2
"""CP-SAT's deterministic time per solve (and per enumeration of the window): the same work
on any machine at any load, so the same input gives the same split. Small tables solve in a
fraction of it; a deep pipeline's (dozens of stages whose middles are alike) can take seconds
to prove and a search makes hundreds, so past the limit the best split found (at worst the
hint) is the answer."""
TIME_LIMIT_S = 5.0
"""Wall-clock safety net only (the deterministic limit binds first)."""


@dataclass(frozen=True)
class StageTable:
    """Per stage, {count: (t ns, e ns)} for the counts that fit."""

    costs: tuple[dict[int, tuple[int, int]], ...]
    num_blocks: int
    num_microbatches: int

    @property
    def key(self) -> tuple:
        """The table's content, hashable (what its pool depends on)."""
        return (tuple(tuple(row.items()) for row in self.costs), self.num_blocks,
                self.num_microbatches)


def _canonical_stage(graph: LayerGraph, rank: int, pp: int, count: int) -> tuple[int, int]:
    """Layers of a stage at ``rank`` with ``count`` blocks: the first from layer 0, the last to
    the end, a middle one from the second block (alike blocks cost the same anywhere)."""
    blocks, end = graph.block_indices(), len(graph.layers)
    if rank == 0:
        return 0, blocks[0] + count if pp > 1 else end
    if rank == pp - 1:
        first = blocks[-1] - count + 1
        return first, end - first
    return blocks[1], count


def _stage_cost(problem: Problem, plan: Plan, rank: int, count: int,
                memory: bool = True) -> tuple[int, int] | None:
    """(t, e) of a stage in ns, None when over the memory limit (``memory``: its memory is
    priced first, and its times only where it fits)."""
    if memory and _stage_mib(problem, plan, rank, count) > limit_mib(problem):
        return None
    t, e, _ = _stage_profile(problem, plan, rank, count)
    return t, e


def _stage_mib(problem: Problem, plan: Plan, rank: int, count: int) -> int:
    """A stage's memory in MiB, as ``_stage_profile`` has it, without its times."""
    key = ("partition_stage_mib", plan, rank, count)
    table = memo(problem)
    if key not in table:
        stage = _canonical_stage(problem.graph, rank, plan.pp, count)
        table[key] = memory_mib(rank_memory_bytes(problem, plan, rank, stage))
    return table[key]


def _stage_profile(problem: Problem, plan: Plan, rank: int, count: int) -> tuple[int, int, int]:
    """(t ns, e ns, memory MiB) of a stage, kept in the problem's memo: the fit screens, the
    tables of each switch setting and the runners-up ask for the same stages again."""
    key = ("partition_stage", plan, rank, count)
    table = memo(problem)
    if key not in table:
        stage = _canonical_stage(problem.graph, rank, plan.pp, count)
        profile = rank_profile(problem, plan, rank, stage)
        table[key] = (round(profile.micro_batch_s * NS), round(profile.after_s * NS),
                      memory_mib(profile.memory_bytes))
    return table[key]


class StageCosts:
    """Each stage's (t, e) per block count, computed when first asked (``_stage_cost``), and
    the counts admissible under the memory limit and the hint's slowest-stage cap."""

    def __init__(self, problem: Problem, plan: Plan, hint: tuple[int, ...], memory: bool):
        self.problem, self.plan, self.hint, self.memory = problem, plan, hint, memory
        self.total = len(problem.graph.block_indices())
        self._known: dict[tuple[int, int], tuple[int, int] | None] = {}
        self.cap = _slowest_cap(problem, plan, hint, self.cost)

    def cost(self, s: int, c: int) -> tuple[int, int] | None:
        if (s, c) not in self._known:
            self._known[s, c] = _stage_cost(self.problem, self.plan, s, c, self.memory)
        return self._known[s, c]

    def admissible(self, s: int, c: int) -> bool:
        """Stage s may run c blocks: it fits and is not slower than the cap."""
        if not 1 <= c <= self.total - (self.plan.pp - 1):
            return False
        cost = self.cost(s, c)
        return cost is not None and (self.cap is None or cost[0] <= self.cap)


def read_problem(problem: Problem, plan: Plan, hint: tuple[int, ...], *,
                 memory: bool = True, costs: StageCosts | None = None) -> StageTable:
    """Tabulate each stage's costs per block count (see the module docstring); ``memory``
    False tabulates counts over the limit too. A stage's time and memory grow with its count,
    so its largest admissible count is found by binary search, and its smallest is what the
    other stages' largest leave."""
    costs = costs or StageCosts(problem, plan, hint, memory)
    pp, total = plan.pp, costs.total
    highest = [_largest_from(lambda c, s=s: costs.admissible(s, c), hint[s], total - (pp - 1))
               for s in range(pp)]
    rows = []
    for s in range(pp):
        lowest = max(1, total - (sum(highest) - highest[s]))
        rows.append({c: costs.cost(s, c) for c in range(lowest, highest[s] + 1)})
    return StageTable(tuple(rows), total, plan.num_microbatches)


def _slowest_cap(problem: Problem, plan: Plan, hint: tuple[int, ...], cost) -> float | None:
    """The slowest stage a split better than the hint can have: (m - 1) T + S + E <= hint, E >=
    0, and the stages' times sum to the same S for every split (alike blocks; the ends and
    each stage's sends are fixed), up to one unit of rounding per stage. None with m = 1 or a
    hint that does not fit."""
    m = plan.num_microbatches
    hinted = [cost(s, c) for s, c in enumerate(hint)]
    if m == 1 or not all(hinted):
        return None
    times = sum(t for t, _ in hinted)
    return (_objective(hinted, m) - times + len(hint) + 1) / (m - 1)


def _largest(admissible, most: int, least: int = 0) -> int:
    """The largest c in 1..most with ``admissible(c)`` (a predicate true up to some count),
    0 when none; ``least`` is a count known admissible (the search starts above it)."""
    low, high = max(least, 1), most
    if not least and not admissible(1):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if admissible(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _largest_from(admissible, hinted: int, most: int) -> int:
    """``_largest`` searched from the hint's count: above it where it is admissible, below
    it where not (the largest count is usually near the balanced one)."""
    if hinted <= most and admissible(hinted):
        return _largest(admissible, most, hinted)
    return _largest(admissible, min(hinted, most + 1) - 1)


def _objective(costs: list[tuple[int, int]], m: int) -> int:
    times = [t for t, _ in costs]
    return (m - 1) * max(times) + sum(times) + max(e for _, e in costs)


class PartitionModel:
    """The CP-SAT model over one stage table."""

    def __init__(self, table: StageTable) -> None:
        self.table = table
        self.model = cp_model.CpModel()
        self.x = [{c: self.model.new_bool_var(f"x_{s}_{c}") for c in row}
                  for s, row in enumerate(table.costs)]
        top_t = max((t for row in table.costs for t, _ in row.values()), default=0)
        top_e = max((e for row in table.costs for _, e in row.values()), default=0)
        self.slowest = self.model.new_int_var(0, top_t, "slowest")
        self.after = self.model.new_int_var(0, top_e, "after")
        self.add_one_count()
        self.add_composition()
        self.add_memory()
        self.add_slowest()
        self.objective = self.add_objective()

    def stage_time(self, s: int) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.weighted_sum(
            list(self.x[s].values()), [t for t, _ in self.table.costs[s].values()])

    def add_one_count(self) -> None:
        """Each stage runs exactly one number of blocks."""
        for s, row in enumerate(self.x):
            self.model.add_exactly_one(list(row.values())).with_name(f"one_count_{s}")

    def add_composition(self) -> None:
        """The stages' counts add up to the model's blocks."""
        terms = [(var, c) for row in self.x for c, var in row.items()]
        self.model.add(cp_model.LinearExpr.weighted_sum([v for v, _ in terms],
                                                          [c for _, c in terms])
                       == self.table.num_blocks).with_name("composition")

    def add_memory(self) -> None:
        """Counts over a stage's memory limit are never tabulated (``read_problem`` stops at
        the first, memory grows with blocks); a stage left with no count makes the model
        infeasible, which this states."""
        for s, row in enumerate(self.x):
            if not row:
                self.model.add_bool_or([]).with_name(f"memory_{s}")

    def add_slowest(self) -> None:
        """T and E are the largest stage time and post-drain term (equalities, so that each
        split is one solution when they are enumerated)."""
        stages = range(len(self.x))
        self.model.add_max_equality(self.slowest, [self.stage_time(s) for s in stages]
                                    ).with_name("slowest")
        self.model.add_max_equality(self.after, [cp_model.LinearExpr.weighted_sum(
            list(self.x[s].values()), [e for _, e in self.table.costs[s].values()])
            for s in stages]).with_name("after")

    def add_objective(self) -> cp_model.LinearExpr:
        m = self.table.num_microbatches
        objective = ((m - 1) * self.slowest + self.after
                     + sum(self.stage_time(s) for s in range(len(self.x))))
        self.model.minimize(objective)
        return objective

    def add_hint(self, counts: tuple[int, ...]) -> None:
        for s, row in enumerate(self.x):
            for c, var in row.items():
                self.model.add_hint(var, c == counts[s])

    def counts(self, solver) -> tuple[int, ...]:
        return tuple(next(c for c, var in row.items() if solver.boolean_value(var))
                     for row in self.x)

    def solve(self, hint: tuple[int, ...] | None = None) -> tuple[int, list[tuple[int, ...]]]:
        """The optimum and every solution within WINDOW of it (at most POOL); none without
        solving where the counts that fit cannot add up to the blocks; the admissible
        ``hint`` alone where the time limit passes before any solution."""
        costs, total = self.table.costs, self.table.num_blocks
        if not all(costs) or sum(max(row) for row in costs) < total:
            return 0, []
        if all(len(row) == 1 for row in costs):  # one split left: nothing to choose
            only = tuple(next(iter(row)) for row in costs)
            return (0, [only]) if sum(only) == total else (0, [])
        solver = _solver()
        status = solver.solve(self.model)
        if status == cp_model.INFEASIBLE:
            return 0, []
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # time limit: the hint
            return 0, [hint] if hint else []
        best = round(solver.objective_value)
        self.model.clear_objective()
        self.model.clear_hints()
        self.model.add(self.objective <= best + int(best * WINDOW) + len(self.x) + 1
                       ).with_name("near_optimum")
        pool = _Pool(self)
        enumerate_ = _solver()
        enumerate_.parameters.enumerate_all_solutions = True
        enumerate_.solve(self.model, pool)
        return best, sorted(pool.found | {self.counts(solver)})


class _Pool(cp_model.CpSolverSolutionCallback):
    def __init__(self, model: PartitionModel) -> None:
        super().__init__()
        self.partition, self.found = model, set()

    def on_solution_callback(self) -> None:
        self.found.add(self.partition.counts(self))
        if len(self.found) >= POOL:
            self.stop_search()


def _solver() -> cp_model.CpSolver:
    """One worker, fixed seed. The model is a few hundred booleans solved thousands of times
    a search: probing and symmetry detection cost more than they find here. No presolve: it
    computes the domain of each stage's weighted sum of booleans, which on a table of ~37
    counts per stage with post-drain terms of minutes (10 Gb/s data parallelism) took seconds
    and gigabytes (tests/sweep grew to 13 GB); the first linearization level keeps the LP
    relaxation of the max-equalities, which proves the optimum in a few branches where pure
    search took ~12,000 conflicts (0.03 s against 1.2 s on that table)."""
    solver = cp_model.CpSolver()
    solver.parameters.random_seed = RANDOM_SEED
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = TIME_LIMIT_S
    solver.parameters.max_deterministic_time = DETERMINISTIC_LIMIT
    solver.parameters.cp_model_presolve = False
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.linearization_level = 1
    solver.parameters.symmetry_level = 0
    return solver


def applies(problem: Problem, pp: int, vpp: int) -> bool:
    """Whether the model chooses this shape's split: a pipeline of one chunk per rank over
    blocks that are all alike, on a homogeneous cluster."""
    return problem.cluster.is_homogeneous and split_is_chosen(problem.graph, pp, vpp)


def near_optimal_splits(problem: Problem, plan: Plan, *, memory: bool = True,
                        cache: dict | None = None) -> list[tuple[Stage, ...]]:
    """The stages of every split within WINDOW of the model's optimum for ``plan``'s degrees
    and switches (``applies`` must hold), lexicographically by block counts, for the caller to
    re-evaluate; empty when no split fits. ``memory=False`` ignores the limit (for bounds).
    Where the hint is provably the only split in the window (``hint_is_alone``) no model is
    built; ``cache`` maps stage tables already solved to their pools (equal tables, e.g. of
    ZeRO stages that change no stage's time, post-drain term or fit, have equal answers)."""
    graph = problem.graph
    hint = block_counts(graph, balanced_stages(graph, plan.pp))
    costs = StageCosts(problem, plan, hint, memory)
    if hint_is_alone(costs, plan.num_microbatches):
        return [stages_of_counts(graph, hint)]
    table = read_problem(problem, plan, hint, memory=memory, costs=costs)
    pool = None if cache is None else cache.get(table.key)
    if pool is None:
        pool = _solve_pool(table, hint)
        if cache is not None:
            cache[table.key] = pool
    return [stages_of_counts(graph, counts) for counts in pool]


def _solve_pool(table: StageTable, hint: tuple[int, ...]) -> list[tuple[int, ...]]:
    model = PartitionModel(table)
    admissible = all(c in row for c, row in zip(hint, table.costs))
    if admissible:
        model.add_hint(hint)
    return model.solve(hint if admissible else None)[1]


def hint_is_alone(costs: StageCosts, m: int) -> bool:
    """Whether the hint is admissible and every other split is outside the window above it,
    so the model's pool would be the hint alone; asks for 2p stage costs, not the table. Any
    other split gives some stage s more blocks than the hint (the counts sum to the same B),
    so its objective is at least (m - 1) t[s][hint_s + 1] + S - p (T at least that stage's
    time, post-drain term at least 0, and S, the same for every split, less one unit of
    rounding per stage); a stage whose next count is not admissible (over the memory limit or
    the slowest-stage cap) cannot grow. The usual case for alike blocks split evenly, where a
    block moved is worth more than the ends' embedding and head."""
    hint, p = costs.hint, len(costs.hint)
    if not all(costs.admissible(s, c) for s, c in enumerate(hint)):
        return False
    hinted = [costs.cost(s, c) for s, c in enumerate(hint)]
    best = _objective(hinted, m)
    times = sum(t for t, _ in hinted)
    grown = [costs.cost(s, c + 1)[0] for s, c in enumerate(hint) if costs.admissible(s, c + 1)]
    if not grown:
        return True
    lower = (m - 1) * min(grown) + times - p
    return lower > best + int(best * WINDOW) + p + 1


def split_fits(problem: Problem, plan: Plan) -> bool:
    """Whether some split of the blocks fits in memory under ``plan``'s degrees and switches
    (``applies`` must hold), without a model: a stage's memory grows with its blocks, so some
    split fits exactly when each stage's largest fitting count is at least 1 and those counts
    reach the blocks. Searched from the balanced split: the stages over the limit there give
    up blocks (binary search below their balanced count), and the others are asked only
    whether they take up what those gave up."""
    graph = problem.graph
    hint = block_counts(graph, balanced_stages(graph, plan.pp))
    fits = [lambda c, s=s: _stage_cost(problem, plan, s, c) is not None
            for s in range(plan.pp)]
    short, spare = 0, []
    for s, count in enumerate(hint):
        if fits[s](count):
            spare.append(s)
            continue
        largest = _largest(fits[s], count - 1)
        if not largest:
            return False
        short += count - largest
    for s in spare:
        if short <= 0:
            break
        short -= _largest(fits[s], hint[s] + short, hint[s]) - hint[s]
    return short <= 0
