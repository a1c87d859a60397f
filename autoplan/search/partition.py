"""CP-SAT choice of the layer-to-stage partition: how many transformer blocks each pipeline stage
runs, for one shape and one setting of the switches, in the steps of OR-Tools'
``examples/python/line_balancing_sat.py`` (read the problem, a greedy hint, the model, solve,
re-evaluate the answer). One model serves a cluster of one kind of GPU (``StageCosts``) and
the node groups of a heterogeneous one (``GroupStageCosts``): they differ only in the table.

Read problem
    B blocks over p stages (pipeline ranks), m micro-batches, v chunks a rank (interleaved when
    v > 1: stage s's c blocks spread evenly over its chunks, ``space.stages_of_rank_totals``;
    node groups v = 1). For stage s running c blocks (the embedding with its first chunk on
    rank 0, the final norm, head and loss with the last rank's last) the cost
    model gives, in whole ns, its micro-batch time ``t[s][c]`` and what it adds after the
    pipeline drains ``e[s][c]`` (its gradient reduction and optimizer step), and its memory
    against its limit (whole MiB, as the table compares): ``costmodels.step.rank_profile``
    and the user's limit on one kind of GPU; on node groups ``costmodels.groups.stage_cost``,
    stage s on its group ``groups[s]`` (that group's GPU, its links to its neighbours, its own
    limit), so the groups become per-stage speed and capacity. A stage's costs then depend on
    its position and count only, which holds when all blocks are alike (``uniform``): the
    model is built for those; other models keep the menu of ``space.stage_variants``
    (``space.split_is_chosen``; ``hetero`` on node groups). A stage's counts run up to the
    largest that fits and whose ``t[s][c]`` is at most the cap the hint's objective allows
    (below; searched outward from the hint's count, both grow with c), and down to what the
    other stages' largest leave.
Greedy hint
    One kind of GPU: the balanced split (``space.balanced_stages``). Its objective caps the
    slowest stage: (m v - 1) T + S + v E <= hint + rounding, with S = sum t the same for every
    split (alike blocks), gives T <= (hint - S + rounding) / (m v - 1) (m v > 1), so larger
    counts cannot be in the window. Node groups: the split of least slowest stage T*
    (``GroupStageCosts.first_hint``: a greedy or a binary search), and since S there is at
    least t[s][c] plus the other stages' one-block times, m t[s][c] <= hint + rounding -
    sum_r t[r][1] + t[s][1] caps each stage; (m - 1) T* + sum_r t[r][1] bounds every split,
    which lets the caller drop a table that cannot beat its best plan before any model.

Decision variables
    ``x[s][c]`` (bool): stage s runs c blocks; T the slowest stage, E the largest post-drain
    term (integers, ns).

Constraints (one ``add_<family>`` each, every constraint named)
    1. one count per stage: ``sum_c x[s][c] == 1``                      → add_one_count()
    2. composition: ``sum_s sum_c c x[s][c] == B``                      → add_composition()
    3. memory: ``x[s][c] == 0`` where stage s with c blocks is over its limit → add_memory()
    4. slowest: ``T == max_s sum_c t[s][c] x[s][c]``, ``E == max_s sum_c e[s][c] x[s][c]``
                                                                         → add_slowest()
    5. symmetry: ``sum_c c x[s][c] <= sum_c c x[s'][c]`` for consecutive members s < s' of
       each class of interchangeable stages (rows that agree where both have a count, their
       intervals of counts ascending: permuting their counts leaves the objective as it is;
       the middle stages of one kind of GPU, or of one group)             → add_symmetry()

Objective
    ``(m v - 1) T + sum_s sum_c t[s][c] x[s][c] + v E``: v times the schedule's step
    (``costmodels.pipeline``: interleaved m T + (S - T) / v, 1F1B at v = 1) plus the slowest
    post-drain term, the step as ``costmodels.groups`` writes it for node groups.

Solve and re-evaluate
    Skipped where the hint is provably alone in the window (``hint_is_alone``: any other
    split gives some stage one block more, which already costs more than the window). One
    worker, a fixed seed and a deterministic time limit (same input, same partition; past
    it the best split found, at worst the hint, with the objective bound CP-SAT had proven:
    ``Solved.floor``, which the search's status reports as FEASIBLE). The integer objective differs from
    ``estimate()``'s float step by the rounding of each term (under (m + p) / 2 ns) and, on
    one kind of GPU, by the post-drain term (which ``estimate()`` takes from the rank with
    most parameters rather than stage by stage), so every solution within the window of the
    optimum (``window_top``: ``WINDOW`` of it on one kind of GPU, m + p + 1 ns on node
    groups) is enumerated (at most ``POOL`` of them), on node groups the permutations of
    interchangeable stages' counts put back (``permutations_of_interchangeable``; on one kind of
    GPU the ascending order stands for them: ``StageCosts.permuted``), and each re-evaluated in
    floats: with
    ``step_and_peak`` on one kind of GPU, the fastest in whole µs, then least memory, then
    the lexicographically first counts (the table's and the brute force's order); with
    ``groups.step_time`` on node groups, the least step, then the first counts.
    ``tests/search/test_partition.py`` and ``tests/search/test_hetero_partition.py`` check it
    against every composition on small cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.search.cpsat import cp_model

from autoplan.costmodels.groups import stage_cost, step_time
from autoplan.costmodels.problem import Problem, limit_mib, memo, memory_mib
from autoplan.costmodels.step import rank_memory_bytes, rank_profile
from autoplan.graph.layer_graph import LayerGraph
from autoplan.plan import Plan, Stage
from autoplan.search.space import (
    balanced_stages, rank_block_totals, rank_chunk_counts, split_is_chosen, stages_of_rank_totals,
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
    share: float = WINDOW
    rounding: int = 0
    """``StageCosts.share`` and ``rounding``: what the window around the optimum spans."""
    permuted: bool = True
    """``StageCosts.permuted``: whether the pool lists every order of interchangeable stages'
    counts or the ascending one stands for them."""
    vpp: int = 1
    """Chunks per rank: the objective is the interleaved step times vpp (``objective``)."""

    @property
    def key(self) -> tuple:
        """The table's content, hashable (what its pool depends on)."""
        return (tuple(tuple(row.items()) for row in self.costs), self.num_blocks,
                self.num_microbatches, self.share, self.rounding, self.permuted, self.vpp)

    def seconds(self, objective: float) -> float:
        """The step in seconds an objective value stands for, less the rounding."""
        return (objective - self.rounding) / (NS * self.vpp)

    def window_top(self, best: int) -> int:
        return window_top(best, self.share, self.rounding)


def window_top(best: int, share: float, rounding: int) -> int:
    """The largest objective re-evaluated when the optimum is ``best``: its ``share`` of it
    and ``rounding`` units more."""
    return best + int(best * share) + rounding


def _canonical_chunks(graph: LayerGraph, rank: int, pp: int, vpp: int,
                      count: int) -> tuple[tuple[int, int], ...]:
    """Layers ``(first, num)`` of each chunk of the rank running ``count`` blocks, spread over
    its ``vpp`` chunks as ``space.chunk_counts`` spreads them: the model's first chunk from
    layer 0, its last to the end, any other from the second block (alike blocks cost the same
    anywhere)."""
    blocks, end = graph.block_indices(), len(graph.layers)
    chunks = []
    for chunk, size in enumerate(rank_chunk_counts(count, vpp)):
        if rank == 0 and chunk == 0:
            chunks.append((0, blocks[0] + size))
        elif rank == pp - 1 and chunk == vpp - 1:
            first = blocks[-1] - size + 1
            chunks.append((first, end - first))
        else:
            chunks.append((blocks[1], size))
    return tuple(chunks)


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
        chunks = _canonical_chunks(problem.graph, rank, plan.pp, plan.vpp, count)
        table[key] = memory_mib(rank_memory_bytes(problem, plan, rank, chunks))
    return table[key]


def _stage_profile(problem: Problem, plan: Plan, rank: int, count: int) -> tuple[int, int, int]:
    """(t ns, e ns, memory MiB) of a stage, kept in the problem's memo: the fit screens, the
    tables of each switch setting and the runners-up ask for the same stages again."""
    key = ("partition_stage", plan, rank, count)
    table = memo(problem)
    if key not in table:
        chunks = _canonical_chunks(problem.graph, rank, plan.pp, plan.vpp, count)
        profile = rank_profile(problem, plan, rank, chunks)
        table[key] = (round(profile.micro_batch_s * NS), round(profile.after_s * NS),
                      memory_mib(profile.memory_bytes))
    return table[key]


class StageCosts:
    """Each stage's (t, e) per block count on a cluster of one kind of GPU, computed when first
    asked (``_stage_cost``), the hint (the balanced split) and the counts admissible under the
    memory limit and the hint's slowest-stage cap."""

    share = WINDOW
    """Share of the optimum within which splits are re-evaluated (see WINDOW)."""
    permuted = False
    """Interchangeable stages' counts ascending stand for their other orders: the splits are
    compared in whole µs, where those have the same step (the same stage times in another
    order), then by peak memory, least for the ascending one (each stage holds no more
    micro-batches in flight than the one before, so the larger counts go where they cost
    least), then by counts, of which it is the lexicographically first."""

    def __init__(self, problem: Problem, plan: Plan, memory: bool = True):
        self.problem, self.plan, self.memory = problem, plan, memory
        self.total = len(problem.graph.block_indices())
        self._known: dict[tuple[int, int], tuple[int, int] | None] = {}
        self.hint = self.first_hint()
        self.cap = self.slowest_cap()

    def price(self, s: int, c: int) -> tuple[int, int] | None:
        """(t, e) of stage s with c blocks in ns, None over its memory limit."""
        return _stage_cost(self.problem, self.plan, s, c, self.memory)

    def cost(self, s: int, c: int) -> tuple[int, int] | None:
        if (s, c) not in self._known:
            self._known[s, c] = self.price(s, c)
        return self._known[s, c]

    def first_hint(self) -> tuple[int, ...] | None:
        """The ranks' blocks in the balanced layout."""
        graph, plan = self.problem.graph, self.plan
        return rank_block_totals(graph, balanced_stages(graph, plan.pp, plan.vpp), plan.pp)

    def rounding(self) -> int:
        """Integer units the objective of a split may differ by between tables: one per stage
        time (each rounded), and one more a chunk (the share covers the post-drain term's)."""
        return self.plan.pp + self.plan.vpp

    def times_floor(self) -> int:
        """The least sum of stage times a split can have (the hint fits): alike blocks on one
        kind of GPU give every split the same sum S, the hint's (up to ``rounding``)."""
        return sum(self.cost(s, c)[0] for s, c in enumerate(self.hint))

    def slowest_cap(self) -> tuple[float, ...] | None:
        """Per stage, the slowest it can be in a split within the window of the hint:
        (m v - 1) T + S + v E <= hint + rounding (``objective``), with E >= 0 and S >=
        ``times_floor``. None with m v = 1 or a hint that does not fit."""
        m, vpp = self.plan.num_microbatches, self.plan.vpp
        hinted = [self.cost(s, c) for s, c in enumerate(self.hint or ())]
        if m * vpp == 1 or not self.hint or not all(hinted):
            return None
        cap = ((_objective(hinted, m, vpp) - self.times_floor() + self.rounding())
               / (m * vpp - 1))
        return (cap,) * self.plan.pp

    def admissible(self, s: int, c: int) -> bool:
        """Stage s may run c blocks: it fits and is not slower than its cap."""
        vpp = self.plan.vpp
        if not vpp <= c <= self.total - (self.plan.pp - 1) * vpp:
            return False
        cost = self.cost(s, c)
        return cost is not None and (self.cap is None or cost[0] <= self.cap[s])



class GroupStageCosts(StageCosts):
    """The same table for stages on node groups, stage s on ``groups[s]``: its times come from
    its group's GPU and links, its memory is held against its group's own limit
    (``costmodels.groups.stage_cost``, with its neighbours' groups fixed), so the rows differ
    by group and nothing else in the model changes. The step on node groups is the model's
    objective itself (``groups.step_time``: each stage's own post-drain term), so only the
    rounding separates the two: the window has no share, and every split whose float step
    could be the least is in it."""

    share = 0.0
    permuted = True
    """Steps are compared in floats here, whose last bits depend on the order of the stage
    times' sum: every order of interchangeable stages' counts is re-evaluated."""

    def __init__(self, problem: Problem, plan: Plan, groups: tuple[str, ...], beaten=None):
        self.groups, self.beaten = groups, beaten
        self._floats: dict[tuple[int, int], tuple[float, float, bool]] = {}
        super().__init__(problem, plan)

    def floats(self, s: int, c: int) -> tuple[float, float, bool]:
        """(t s, e s, fits) of stage s with c blocks, as ``estimate()`` has them."""
        if (s, c) not in self._floats:
            (stage,) = _canonical_chunks(self.problem.graph, s, self.plan.pp, 1, c)
            cost = stage_cost(self.problem, self.plan, s, self.groups, stage)
            self._floats[s, c] = (cost.cost.micro_batch_s, cost.after_s, cost.fits)
        return self._floats[s, c]

    def price(self, s: int, c: int) -> tuple[int, int] | None:
        t, e, fits = self.floats(s, c)
        return (round(t * NS), round(e * NS)) if fits else None

    def first_hint(self) -> tuple[int, ...] | None:
        """A split of least slowest stage T*, the bottleneck the objective weighs m - 1 times
        (line balancing's hint), by whichever of two exact searches asks fewer stage costs:
        about p (2 log2 B + 1) for ``bisected_hint`` (two binary searches a stage: shallow
        pipelines of many blocks), B + p for ``greedy_hint`` (deep ones of few). None when no
        split fits, or when ``beaten`` holds for ``least_objective_s`` of a bound under T*:
        then no split can win."""
        pp, total = self.plan.pp, self.total
        if any(self.cost(s, 1) is None for s in range(pp)):
            return None
        if pp * (2 * math.log2(total) + 1) < total + pp:
            return self.bisected_hint()
        return self.greedy_hint()

    def cannot_win(self, slowest: int) -> bool:
        """``beaten`` holds where no split's slowest stage is below ``slowest``."""
        return self.beaten is not None and self.beaten(self.least_objective_s(slowest))

    def greedy_hint(self) -> tuple[int, ...] | None:
        """One block per stage, then each next block to the stage whose time with it is least
        (the first of equals) among those it still fits. Each block placed costs at most T*
        (were the least next time above T*, every stage would hold more than a split of
        slowest T* may give it, and the counts would already exceed the blocks), so the
        slowest so far is a bound under T* and the greedy ends at T*."""
        pp, counts = self.plan.pp, [1] * self.plan.pp
        slowest = max(self.cost(s, 1)[0] for s in range(pp))
        for _ in range(self.total - pp):
            if self.cannot_win(slowest):
                return None
            grown = [(self.cost(s, c + 1)[0], s) for s, c in enumerate(counts)
                     if self.cost(s, c + 1) is not None]
            if not grown:  # memory grows with blocks: no split fits
                return None
            time, s = min(grown)
            counts[s] += 1
            slowest = max(slowest, time)
        return None if self.cannot_win(slowest) else tuple(counts)

    def bisected_hint(self) -> tuple[int, ...] | None:
        """T* is the least T at which the stages' largest counts that fit and take at most T
        reach the blocks: binary search on T, each stage's largest count by binary search too
        (its time and memory grow with blocks); then blocks come off the slowest stages (the
        first of equals) down to the total."""
        pp, total = self.plan.pp, self.total
        most = [_largest(lambda c, s=s: self.cost(s, c) is not None, total - (pp - 1))
                for s in range(pp)]
        if sum(most) < total:  # no split fits
            return None

        def largest_within(limit: int) -> list[int]:
            return [_largest(lambda c, s=s: self.cost(s, c)[0] <= limit, most[s], 1)
                    for s in range(pp)]

        low = max(self.cost(s, 1)[0] for s in range(pp))
        high = max(self.cost(s, most[s])[0] for s in range(pp))
        while low < high:
            middle = (low + high) // 2
            if sum(largest_within(middle)) >= total:
                high = middle
            else:
                low = middle + 1
        if self.cannot_win(low):
            return None
        counts = largest_within(low)
        while sum(counts) > total:
            slowest = max(self.cost(s, c)[0] for s, c in enumerate(counts) if c > 1)
            counts[next(s for s, c in enumerate(counts)
                        if c > 1 and self.cost(s, c)[0] == slowest)] -= 1
        return tuple(counts)

    def rounding(self) -> int:
        """(m - 1) T + S + E rounded term by term is within (m + p) / 2 of the float step
        times 1e9, so a split whose float step is least is within m + p of the integer
        optimum (one more for the floats' own rounding)."""
        return self.plan.num_microbatches + self.plan.pp + 1

    def times_floor(self) -> int:
        """On node groups the stages' times sum differently by split; each stage takes at least
        its one-block time (times grow with blocks)."""
        return sum(self.cost(s, 1)[0] for s in range(self.plan.pp))

    def slowest_cap(self) -> tuple[float, ...] | None:
        """Per stage s, its time t in a split within the window of the hint: (m - 1) t + S + E
        <= hint + rounding, with E >= 0 and S at least t plus the other stages' one-block
        times, so m t <= hint + rounding - times_floor + t[s][1] (any m). None where the hint
        does not fit."""
        if not self.hint:
            return None
        m, hinted = self.plan.num_microbatches, [self.cost(s, c) for s, c in enumerate(self.hint)]
        room = _objective(hinted, m) + self.rounding() - self.times_floor()
        return tuple((room + self.cost(s, 1)[0]) / m for s in range(self.plan.pp))

    def least_objective_s(self, slowest: int) -> float:
        """Seconds no split's step is below when no split's slowest stage is below ``slowest``
        (ns): the stages' times sum to at least ``times_floor``, and a step differs from the
        integer objective by under ``rounding``."""
        least = (self.plan.num_microbatches - 1) * slowest + self.times_floor()
        return (least - self.rounding()) / NS

    def step_s(self, counts: tuple[int, ...]) -> float:
        """The step of the split ``counts`` in floats, as ``estimate()`` computes it."""
        stages = [self.floats(s, c) for s, c in enumerate(counts)]
        return step_time([t for t, _, _ in stages], [e for _, e, _ in stages],
                         self.plan.num_microbatches)


def best_split_on_groups(problem: Problem, plan: Plan, groups: tuple[str, ...],
                         cache: dict | None = None, beaten=None, unproven=None
                         ) -> tuple[float, tuple[int, ...]] | None:
    """(step s, blocks per stage) of the fastest split for ``plan``'s degrees and switches with
    stage s on node group ``groups[s]``, every stage within its group's limit, the
    lexicographically first of equal steps (the brute force's order); None when no split
    fits, or when ``beaten(step_s)`` holds for a bound under every split's step (from the
    greedy hint: ``GroupStageCosts.first_hint``). Blocks must be alike
    (``space.uniform_blocks``). The model's window is re-evaluated in floats, so the answer is
    ``estimate()``'s best split wherever the window holds at most POOL splits; ``unproven``
    as in ``near_optimal_splits``."""
    costs = GroupStageCosts(problem, plan, groups, beaten)
    if costs.hint is None:
        return None
    pool = _near_optimal_counts(costs, cache, beaten, unproven)
    return min(((costs.step_s(counts), counts) for counts in pool), default=None)


def read_problem(costs: StageCosts) -> StageTable:
    """Tabulate each stage's costs per block count (see the module docstring). A stage's time
    and memory grow with its count, so its largest admissible count is found by binary search
    (from the hint's), and its smallest is what the other stages' largest leave."""
    pp, vpp, total, hint = costs.plan.pp, costs.plan.vpp, costs.total, costs.hint
    highest = [_largest_from(lambda c, s=s: costs.admissible(s, c), hint[s],
                             total - (pp - 1) * vpp, fewest=vpp)
               for s in range(pp)]
    rows = []
    for s in range(pp):
        lowest = max(vpp, total - (sum(highest) - highest[s]))
        rows.append({c: costs.cost(s, c) for c in range(lowest, highest[s] + 1)})
    return StageTable(tuple(rows), total, costs.plan.num_microbatches, costs.share,
                      costs.rounding(), costs.permuted, vpp)


def _largest(admissible, most: int, least: int = 0, fewest: int = 1) -> int:
    """The largest c in fewest..most with ``admissible(c)`` (a predicate true from ``fewest``
    up to some count: a block a chunk), 0 when none; ``least`` is a count known admissible
    (the search starts above it)."""
    low, high = max(least, fewest), most
    if not least and (fewest > most or not admissible(fewest)):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if admissible(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _largest_from(admissible, hinted: int, most: int, fewest: int = 1) -> int:
    """``_largest`` searched from the hint's count, the largest count being usually within a
    block or two of the balanced one: probes 1, 2, 4, ... counts above the hint where it is
    admissible (below it where not) until they cross the boundary, then bisects what is
    left between the last two probes."""
    if fewest > most:
        return 0
    hinted = min(max(hinted, fewest), most)
    if admissible(hinted):
        low, step = hinted, 1
        while low + step <= most:
            if not admissible(low + step):
                return _largest(admissible, low + step - 1, low, fewest)
            low, step = low + step, 2 * step
        return _largest(admissible, most, low, fewest)
    failed, step = hinted, 1
    while failed - step >= fewest:
        probe = failed - step
        if admissible(probe):
            return _largest(admissible, failed - 1, probe, fewest)
        failed, step = probe, 2 * step
    return _largest(admissible, failed - 1, fewest=fewest)


def _scaled_step(slowest, total, after, m: int, vpp: int):
    """vpp times the step (``costmodels.pipeline``: m T + (S - T) / v) plus v times the
    post-drain term: the model's objective, in integers or as CP-SAT expressions."""
    return (m * vpp - 1) * slowest + total + vpp * after


def _objective(costs: list[tuple[int, int]], m: int, vpp: int = 1) -> int:
    """The model's objective of a split whose stages cost ``costs`` (``PartitionModel``)."""
    times = [t for t, _ in costs]
    return _scaled_step(max(times), sum(times), max(e for _, e in costs), m, vpp)


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
        self.add_symmetry()
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

    def count(self, s: int) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.weighted_sum(list(self.x[s].values()), list(self.x[s]))

    def add_symmetry(self) -> None:
        """Interchangeable stages (``interchangeable_classes``: middle stages of one kind of
        GPU, or of one group) are permutable without changing the objective; their counts
        ascend in pipeline order (the lexicographically first of the permutations), and
        ``solve`` puts the permutations back where the table asks (``StageTable.permuted``)."""
        for members in interchangeable_classes(self.table.costs):
            for first, second in zip(members, members[1:]):
                self.model.add(self.count(first) <= self.count(second)
                               ).with_name(f"symmetry_{first}_{second}")

    def add_objective(self) -> cp_model.LinearExpr:
        objective = _scaled_step(self.slowest, sum(self.stage_time(s) for s in range(len(self.x))),
                                self.after, self.table.num_microbatches, self.table.vpp)
        self.model.minimize(objective)
        return objective

    def add_hint(self, counts: tuple[int, ...]) -> None:
        for s, row in enumerate(self.x):
            for c, var in row.items():
                self.model.add_hint(var, c == counts[s])

    def counts(self, solver) -> tuple[int, ...]:
        return tuple(next(c for c, var in row.items() if solver.boolean_value(var))
                     for row in self.x)

    def solve(self, hint: tuple[int, ...] | None = None, beaten=None) -> "Solved":
        """The optimum and every solution within the window of it (at most POOL); none without
        solving where the counts that fit cannot add up to the blocks; the admissible
        ``hint`` alone where the time limit passes before any solution; None for the pool,
        without enumerating it, where ``beaten(step_s)`` holds for the optimum's bound (less
        the rounding, in seconds). Where the deterministic limit stopped CP-SAT before it
        proved the optimum, ``floor`` is the objective bound it had proven."""
        costs, total = self.table.costs, self.table.num_blocks
        if not all(costs) or sum(max(row) for row in costs) < total:
            return Solved(0, [])
        if all(len(row) == 1 for row in costs):  # one split left: nothing to choose
            only = tuple(next(iter(row)) for row in costs)
            return Solved(0, [only] if sum(only) == total else [])
        solver = _solver()
        status = solver.solve(self.model)
        if status == cp_model.INFEASIBLE:
            return Solved(0, [])
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # time limit: the hint
            return Solved(0, [hint] if hint else [], floor=0)
        best = round(solver.objective_value)
        floor = None if status == cp_model.OPTIMAL else math.floor(solver.best_objective_bound)
        if beaten is not None and beaten(self.table.seconds(round(solver.best_objective_bound))):
            return Solved(best, None, floor)
        self.model.clear_objective()
        self.model.clear_hints()
        self.model.add(self.objective <= self.table.window_top(best)).with_name("near_optimum")
        pool = _Pool(self)
        enumerate_ = _solver()
        enumerate_.parameters.enumerate_all_solutions = True
        enumerate_.solve(self.model, pool)
        found = pool.found | {self.counts(solver)}
        if self.table.permuted:
            found = {c for counts in found
                     for c in permutations_of_interchangeable(self.table.costs, counts)}
        return Solved(best, sorted(found), floor)


@dataclass(frozen=True)
class Solved:
    """A partition model's answer: the optimum's integer objective, the splits of its window
    (None: beaten, not enumerated) and, where CP-SAT's deterministic limit passed before it
    proved the optimum, the objective bound it had proven (``floor``, ns; None when proven)."""

    best: int
    pool: list[tuple[int, ...]] | None
    floor: int | None = None

    def floor_s(self, table: StageTable) -> float | None:
        """The proven bound on any split's step in seconds (less the rounding); None when
        the optimum was proven."""
        return None if self.floor is None else max(0.0, table.seconds(self.floor))


def interchangeable_classes(rows: tuple[dict, ...]) -> list[list[int]]:
    """Classes of two or more stages, each in pipeline order, whose counts can be permuted
    among them without changing the objective: consecutive members agree on the (t, e) of
    every count both may run, and their admissible counts (an interval each) start and end
    no lower than the previous member's. Then any split's counts on a class, sorted
    ascending, are admissible (the k-th smallest of them is within the k-th member's
    interval) and give the stages the same multiset of (t, e): the objective is unchanged.
    Middle stages on one kind of GPU are the usual class: equal times and post-drain terms,
    and under 1F1B each holds fewer micro-batches in flight than the one before, so its
    largest count that fits is no smaller. A stage joins the first class whose last member
    it extends, else starts one."""
    classes: list[list[int]] = []
    for s, row in enumerate(rows):
        if len(row) < 2:
            continue
        joined = next((members for members in classes
                       if _extends(rows[members[-1]], row)), None)
        if joined is None:
            classes.append([s])
        else:
            joined.append(s)
    return [members for members in classes if len(members) > 1]


def _extends(before: dict, row: dict) -> bool:
    """``row`` may follow ``before`` in a class of interchangeable stages: its interval of
    counts starts and ends no lower, and the two agree on every count both have."""
    if min(row) < min(before) or max(row) < max(before):
        return False
    return all(before[c] == row[c] for c in range(min(row), max(before) + 1))


def permutations_of_interchangeable(rows: tuple[dict, ...], counts: tuple[int, ...]
                               ) -> list[tuple[int, ...]]:
    """``counts`` with the counts of each class of interchangeable stages permuted every
    distinct way that keeps each stage's count admissible (their integer objectives are
    equal, their float steps may differ in the last bits and their memory does), when there
    are at most POOL of them; else ``counts`` alone stands for them."""
    out = [tuple(counts)]
    for members in interchangeable_classes(rows):
        arranged = []
        for base in out:
            values_here = [base[s] for s in members]
            if _arrangements(values_here) > POOL:
                return [tuple(counts)]
            for values in _distinct_permutations(values_here):
                if any(value not in rows[s] for s, value in zip(members, values)):
                    continue
                split = list(base)
                for s, value in zip(members, values):
                    split[s] = value
                arranged.append(tuple(split))
                if len(arranged) > POOL:
                    return [tuple(counts)]
        out = arranged
    return out


def _arrangements(values: list[int]) -> int:
    """How many distinct orderings ``values`` has (the multinomial coefficient)."""
    total = math.factorial(len(values))
    for value in set(values):
        total //= math.factorial(values.count(value))
    return total


def _distinct_permutations(values: list[int]):
    """Every distinct ordering of ``values``, lexicographically (next-permutation steps)."""
    current = sorted(values)
    while True:
        yield tuple(current)
        i = len(current) - 2
        while i >= 0 and current[i] >= current[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(current) - 1
        while current[j] <= current[i]:
            j -= 1
        current[i], current[j] = current[j], current[i]
        current[i + 1:] = reversed(current[i + 1:])


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
    """Whether the model chooses this shape's split (``space.split_is_chosen``: blocks all
    alike, a pipeline no deeper than the limits there) on a homogeneous cluster (node groups:
    ``best_split_on_groups``)."""
    return problem.cluster.is_homogeneous and split_is_chosen(problem.graph, pp, vpp)


def near_optimal_splits(problem: Problem, plan: Plan, *, memory: bool = True,
                        cache: dict | None = None, unproven=None) -> list[tuple[Stage, ...]]:
    """The stages of every split within WINDOW of the model's optimum for ``plan``'s degrees
    and switches (``applies`` must hold), lexicographically by block counts, for the caller to
    re-evaluate; empty when no split fits. ``memory=False`` ignores the limit (for bounds).
    Where the hint is provably the only split in the window (``hint_is_alone``) no model is
    built; ``cache`` maps stage tables already solved to their answers (equal tables, e.g. of
    ZeRO stages that change no stage's time, post-drain term or fit, have equal answers).
    ``unproven(floor_s)`` is called where CP-SAT's deterministic limit left the optimum
    unproven, with the step no split is below."""
    return [stages_of_rank_totals(problem.graph, counts, plan.vpp)
            for counts in _near_optimal_counts(StageCosts(problem, plan, memory), cache,
                                               unproven=unproven)]


def _near_optimal_counts(costs: StageCosts, cache: dict | None, beaten=None, unproven=None
                         ) -> list[tuple[int, ...]]:
    """The block counts of every split in the window of the model's optimum over ``costs``;
    none where ``beaten`` holds for the optimum (that answer is not kept in ``cache``: it
    depends on the caller's incumbent); ``unproven`` as in ``near_optimal_splits``."""
    if costs.hint is None:  # no split fits
        return []
    if hint_is_alone(costs, costs.plan.num_microbatches):
        return [costs.hint]
    table = read_problem(costs)
    solved = None if cache is None else cache.get(table.key)
    if solved is None:
        solved = _solve_pool(table, costs.hint, beaten)
        if solved.pool is not None and cache is not None:
            cache[table.key] = solved
    floor_s = solved.floor_s(table)
    if solved.pool is not None and floor_s is not None and unproven is not None:
        unproven(floor_s)
    return solved.pool or []


def _solve_pool(table: StageTable, hint: tuple[int, ...], beaten=None) -> Solved:
    model = PartitionModel(table)
    admissible = all(c in row for c, row in zip(hint, table.costs))
    if admissible:
        model.add_hint(hint)
    return model.solve(hint if admissible else None, beaten)


def hint_is_alone(costs: StageCosts, m: int) -> bool:
    """Whether the hint is admissible and every other split is outside the window above it,
    so the model's pool would be the hint alone; asks for 2p stage costs, not the table. Any
    other split gives some stage s more blocks than the hint (the counts sum to the same B),
    so its objective is at least (m v - 1) t[s][hint_s + 1] + F - p (T at least that stage's
    time, post-drain term at least 0, and F = ``times_floor``, on one kind of GPU the S every
    split has, less one unit of rounding per stage); a stage whose next count is not
    admissible (over its memory limit or its cap) cannot grow. The usual case for alike
    blocks split evenly, where a block moved is worth more than the ends' embedding and
    head."""
    hint = costs.hint
    if not hint or not all(costs.admissible(s, c) for s, c in enumerate(hint)):
        return False
    vpp = costs.plan.vpp
    hinted = [costs.cost(s, c) for s, c in enumerate(hint)]
    best = _objective(hinted, m, vpp)
    grown = [costs.cost(s, c + 1)[0] for s, c in enumerate(hint) if costs.admissible(s, c + 1)]
    if not grown:
        return True
    lower = (m * vpp - 1) * min(grown) + costs.times_floor() - len(hint)
    return lower > window_top(best, costs.share, costs.rounding())


def split_fits(problem: Problem, plan: Plan) -> bool:
    """Whether some split of the blocks fits in memory under ``plan``'s degrees and switches
    (``applies`` must hold), without a model: a stage's memory grows with its blocks, so some
    split fits exactly when each stage's largest fitting count is at least 1 and those counts
    reach the blocks. Searched from the balanced split: the stages over the limit there give
    up blocks (binary search below their balanced count), and the others are asked only
    whether they take up what those gave up."""
    graph, vpp = problem.graph, plan.vpp
    hint = rank_block_totals(graph, balanced_stages(graph, plan.pp, vpp), plan.pp)
    fits = [lambda c, s=s: _stage_cost(problem, plan, s, c) is not None
            for s in range(plan.pp)]
    short, spare = 0, []
    for s, count in enumerate(hint):
        if fits[s](count):
            spare.append(s)
            continue
        largest = _largest_from(fits[s], count - 1, count - 1, vpp)
        if not largest:
            return False
        short += count - largest
    for s in spare:
        if short <= 0:
            break
        short -= _largest_from(fits[s], hint[s], hint[s] + short, vpp) - hint[s]
    return short <= 0
