"""CP-SAT search for the fastest plan that fits.

Tabulation (exact pruning, before the model is built)
    Candidates come from ``space`` grouped by shape (tp, pp, dp, mbs, vpp) and stage layout.
    For each group the switches that cannot be slower than the others (no recomputation, no
    offload, ZeRO below 3) are estimated first: the fastest of them is a lower bound on the
    whole group, since recomputation and offload only add time and ZeRO-3 only adds
    communication. Groups are expanded best bound first; a group whose bound is slower than the
    best fitting plan so far cannot hold the optimum and is not expanded. Rows over the memory
    limit stay in the table (for explanations) but not in the model.

Data
    R fitting rows, each with its estimated step time ``time[r]`` (µs) and its degrees
    ``tp[r], pp[r], dp[r], mbs[r], zero[r], recompute[r], sp[r], vpp[r], offload[r]``.

Decision variables
    ``pick[r]`` (bool): row r is the plan.
    One integer per dimension, ``dim = sum(dim_table[r] * pick[r])``, so pins and bounds are
    constraints on named variables and cores can name them (built on demand).

Constraints (one ``add_<family>`` each, every constraint named)
    1. choice: exactly one pick                                        → add_choice()
    2. table link: ``dim == sum(dim_table[r] pick[r])`` per dimension   → add_table_link()
    3. pins: ``dim == pinned`` (assumption literals)                    → add_pins()

Objective
    minimize ``sum((time[r] * R + tiebreak[r]) pick[r])``: step time first; among plans within the
    same microsecond, the stated tie-break order (fewer GPUs, then fewer GPUs per model replica
    (tp*pp), then less memory, then the candidate order) so the same input gives the same plan
    whatever the number of workers.

The fastest fitting row is the hint. Status is OPTIMAL only when CP-SAT proves it; with a time
limit it may be FEASIBLE, reported with the bound.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autoplan.costmodels.step import (
    Problem, estimate, limit_mib, lower_bound_s, memory_mib, step_and_peak,
)
from autoplan.errors import InfeasibleError, NoPlanInTimeError
from autoplan.plan import Estimate, Offload, Plan, Recompute, SolverInfo
from autoplan.search.space import make_plan, max_chunk_blocks, shapes, stage_variants, switches
from autoplan.training import Pins

logger = logging.getLogger(__name__)

US = 1e6
DIMENSIONS = ("tp", "pp", "dp", "cp", "mbs", "zero", "recompute", "sp", "vpp", "offload")
_RECOMPUTE = {r: i for i, r in enumerate(Recompute)}
_OFFLOAD = {o: i for i, o in enumerate(Offload)}
RANDOM_SEED = 0
PROBING_LEVEL = 0
"""The model is one exactly-one over prepared rows: probing only costs time (1.4 s -> 0.26 s on
9,000 rows) and cannot tighten a bound that the LP relaxation already makes exact."""


def _dims_of(plan: Plan) -> dict[str, int]:
    return {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp,
            "mbs": plan.micro_batch_size, "zero": plan.zero_stage,
            "recompute": _RECOMPUTE[plan.recompute], "sp": int(plan.sequence_parallel),
            "vpp": plan.vpp, "offload": _OFFLOAD[plan.offload]}


def pin_values(pins: Pins) -> dict[str, int]:
    """Pins in the table's integer encoding."""
    encoded = {}
    for name, value in pins.pinned().items():
        if name == "recompute":
            value = _RECOMPUTE[Recompute(value)]
        elif name == "offload":
            value = _OFFLOAD[Offload(value)]
        encoded[name] = int(value)
    return encoded


@dataclass
class Table:
    """Evaluated candidate plans with their step time and worst-GPU memory. Full estimates
    (breakdowns, per-stage memory) are computed on demand."""

    problem: Problem
    plans: list[Plan] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    peak_bytes: list[float] = field(default_factory=list)
    pruned: int = 0  # candidates never evaluated: their group's bound was already beaten
    open_bound_s: float = math.inf  # lower bound of candidates left unevaluated at the deadline

    @classmethod
    def build(cls, problem: Problem, pins: Pins, *, deadline: float = math.inf) -> "Table":
        """Evaluate the candidates best bound first until the rest cannot win or the
        ``deadline`` (a ``time.perf_counter()`` value) passes."""
        table = cls(problem)
        groups = table._bound_groups(pins, deadline)
        best = min((round(table.step_times_s[r] * US) for r in table.fitting()), default=None)
        for position, (bound_us, shape, stages, rest) in enumerate(groups):
            if best is not None and bound_us > best:
                table.pruned += sum(len(g[3]) for g in groups[position:])
                break
            if time.perf_counter() > deadline:
                table.open_bound_s = min(table.open_bound_s, bound_us / US)
                break
            for sw in rest:
                step_s = table.add(make_plan(shape, sw, stages, problem.training))
                if memory_mib(table.peak_bytes[-1]) <= limit_mib(problem):
                    best = min(best or math.inf, round(step_s * US))
        return table

    def _bound_groups(self, pins: Pins, deadline: float) -> list[tuple]:
        """Evaluate the lower-bound switches of every (shape, stages) group; the groups sorted
        by bound, with the switches still to evaluate."""
        problem, groups = self.problem, []
        for shape in shapes(problem.graph, world=problem.cluster.num_gpus,
                            gpus_per_node=problem.cluster.gpus_per_node,
                            training=problem.training, pins=pins):
            if time.perf_counter() > deadline:  # shapes never looked at: only physics bounds them
                self.open_bound_s = lower_bound_s(problem)
                break
            for stages in stage_variants(problem.graph, shape.pp, shape.vpp):
                options = switches(shape, runtime=problem.training.runtime, pins=pins,
                                   blocks_per_chunk=max_chunk_blocks(problem.graph, stages))
                fast = [sw for sw in options if _cannot_be_slower(sw)] or options
                bound = min(self.add(make_plan(shape, sw, stages, problem.training))
                            for sw in fast)
                rest = [sw for sw in options if sw not in fast]
                groups.append((round(bound * US), shape, stages, rest))
        return sorted(groups, key=lambda g: g[0])

    def add(self, plan: Plan) -> float:
        step_s, peak = step_and_peak(self.problem, plan)
        self.plans.append(plan)
        self.step_times_s.append(step_s)
        self.peak_bytes.append(peak)
        return step_s

    def __len__(self) -> int:
        return len(self.plans)

    def estimate(self, row: int) -> Estimate:
        return estimate(self.problem, self.plans[row])

    def fitting(self) -> list[int]:
        """Rows within the memory limit, in table order."""
        limit = limit_mib(self.problem)
        return [r for r, b in enumerate(self.peak_bytes) if memory_mib(b) <= limit]

    def tiebreak_key(self, row: int) -> tuple:
        """(GPUs used, tp*pp, memory, candidate order): the stated tie-break."""
        plan = self.plans[row]
        return plan.world_size, plan.tp * plan.pp, self.peak_bytes[row], row


def _cannot_be_slower(sw) -> bool:
    """Switches whose time is a lower bound for their shape: recomputation and offload add
    work, ZeRO-3 adds per-micro-batch gathers; ZeRO 0-2 and SP can go either way."""
    return sw.recompute is Recompute.NONE and sw.offload is Offload.NONE and sw.zero < 3


class PlanModel:
    """The CP-SAT model over the fitting rows of one table."""

    def __init__(self, table: Table, rows: list[int]) -> None:
        self.table = table
        self.rows = rows
        self.model = cp_model.CpModel()
        self.pick = [self.model.new_bool_var(f"pick_{r}") for r in rows]
        self.dims: dict[str, cp_model.IntVar] = {}
        self.assumptions: dict[cp_model.IntVar, str] = {}
        self.add_choice()
        self.add_objective()

    def _linked(self, name: str, values: list[int]) -> cp_model.IntVar:
        var = self.model.new_int_var(min(values), max(values), name)
        self.model.add(var == cp_model.LinearExpr.weighted_sum(self.pick, values)).with_name(
            f"link_{name}")
        return var

    def add_choice(self) -> None:
        """Exactly one candidate is the plan."""
        self.model.add_exactly_one(self.pick).with_name("choice")

    def add_table_link(self) -> None:
        """dim == dim_table[chosen row] for every dimension."""
        rows = [_dims_of(self.table.plans[r]) for r in self.rows]
        for name in DIMENSIONS:
            self.dims[name] = self._linked(name, [row[name] for row in rows])

    def add_pins(self, pins: dict[str, int], labels: dict[str, str]) -> None:
        """User pins as assumption literals."""
        if not self.dims:
            self.add_table_link()
        for name, value in pins.items():
            literal = self.model.new_bool_var(f"pin_{name}")
            self.model.add(self.dims[name] == value).only_enforce_if(literal).with_name(f"pin_{name}")
            self.assumptions[literal] = labels[name]

    def add_objective(self) -> None:
        """Step time in µs, then the tie-break rank."""
        n = len(self.rows)
        order = sorted(range(n), key=lambda i: self.table.tiebreak_key(self.rows[i]))
        rank = [0] * n
        for position, i in enumerate(order):
            rank[i] = position
        keys = [round(self.table.step_times_s[r] * US) * n + rank[i]
                for i, r in enumerate(self.rows)]
        self.scale = n
        self.model.minimize(cp_model.LinearExpr.weighted_sum(self.pick, keys))

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
        self.model.add_assumptions(list(self.assumptions))
        status = solver.solve(self.model)
        return solver, status

    def conflict(self, solver: cp_model.CpSolver) -> list[str]:
        """The assumptions (pins) that together cannot hold."""
        core = solver.sufficient_assumptions_for_infeasibility()
        by_index = {lit.index: label for lit, label in self.assumptions.items()}
        return [by_index[i] for i in core if i in by_index]


def solve_table(problem: Problem, pins: Pins, *, time_limit_s: float, num_workers: int = 1
                ) -> tuple[Plan, Estimate, SolverInfo]:
    """Tabulate the candidates, solve with ``num_workers`` CP-SAT workers, and return the plan
    with its estimate (the same plan for any ``num_workers``: see the tie-break above)."""
    start = time.perf_counter()
    table = Table.build(problem, pins, deadline=start + time_limit_s)
    if not table.fitting() and table.open_bound_s < math.inf:
        raise NoPlanInTimeError(
            f"no plan that fits was found within --time-limit {time_limit_s:g}s; raise the "
            "limit or pin more dimensions.")
    if not len(table):
        raise InfeasibleError(
            "no legal plan exists for these pins on this cluster and batch: the pinned degrees "
            "must fit the GPU count, and the global batch must divide by dp*mbs.")
    rows = table.fitting()
    if not rows:
        raise InfeasibleError(explain_infeasible(table, problem))
    model = PlanModel(table, rows)
    fastest = min(rows, key=lambda r: (round(table.step_times_s[r] * US), table.tiebreak_key(r)))
    model.add_hint(fastest)
    remaining = max(0.1, time_limit_s - (time.perf_counter() - start))
    solver, status = model.solve(remaining, num_workers=num_workers)
    wall = time.perf_counter() - start
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        row, name = model.chosen(solver), solver.status_name(status)
        bound = (solver.best_objective_bound // model.scale) / US
        if table.open_bound_s < math.inf:  # optimal among what was evaluated, not proven
            name, bound = "FEASIBLE", min(bound, table.open_bound_s)
    elif status == cp_model.UNKNOWN:  # time limit before CP-SAT's first solution: the hint
        row, name, bound = fastest, "FEASIBLE", 0.0
    else:
        raise NoPlanInTimeError(
            f"no plan found within --time-limit {time_limit_s:g}s; raise the limit or pin "
            "more dimensions.")
    chosen = table.estimate(row)
    objective = chosen.step_time_s
    info = SolverInfo(status=name, objective=objective, bound=min(bound, objective),
                      gap=max(0.0, (objective - bound) / objective), wall_time_s=wall)
    logger.info("solved %d rows (%d fit, %d pruned) in %.2fs: %s", len(table), len(rows),
                table.pruned, wall, info.status)
    return table.plans[row], chosen, info


def explain_infeasible(table: Table, problem: Problem) -> str:
    """Which requirement cannot be met, and by how much."""
    best = min(range(len(table)), key=lambda r: table.peak_bytes[r])
    plan, est = table.plans[best], table.estimate(best)
    stage = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
    return (
        f"nothing fits in {est.memory_limit_gib:.1f} GiB per GPU: even the leanest of "
        f"{len(table)} candidate plans (ZeRO-{plan.zero_stage}, {plan.recompute.value} recompute, "
        f"TP={plan.tp}, PP={plan.pp}, DP={plan.dp}, micro-batch {plan.micro_batch_size}, offload "
        f"{plan.offload.value}) needs {est.peak_memory_gib:.1f} GiB on pipeline stage {stage} "
        f"({est.peak_memory_gib - est.memory_limit_gib:.1f} GiB over). Use more or larger GPUs, "
        "a shorter sequence, a smaller model, or unpin dimensions that keep memory high."
    )
