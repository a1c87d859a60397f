"""CP-SAT search for the fastest plan that fits.

Formulation (the solver only reads prepared tables; estimate() filled them):

Data
    R candidate plans from ``space.candidate_plans`` (legal by construction), each with its
    estimated step time ``time[r]`` (µs), worst-GPU memory ``mem[r]`` (MiB), and its degrees
    ``tp[r], pp[r], dp[r], mbs[r], zero[r], recompute[r], sp[r], vpp[r], offload[r]``.

Decision variables
    ``pick[r]`` (bool): candidate r is the plan; exactly one is true.
    One integer per dimension, ``dim = sum(dim_table[r] * pick[r])``, so pins and bounds are
    constraints on named variables and cores can name them.

Constraints (one ``add_<family>`` each, every constraint named)
    1. choice: exactly one pick                                       → add_choice()
    2. table link: ``dim == sum(dim_table[r] pick[r])`` per dimension  → add_table_link()
    3. memory: ``sum(mem[r] pick[r]) <= limit`` (an assumption literal) → add_memory_limit()
    4. pins: ``dim == pinned`` (assumption literals)                   → add_pins()

Objective
    minimize ``sum((time[r] * R + tiebreak[r]) pick[r])``: step time first; among plans within the
    same microsecond, the stated tie-break order (fewer GPUs per model replica first: smaller
    tp*pp, then less memory, then the candidate order) so the same input gives the same plan
    whatever the number of workers.

A greedy pick (the fastest fitting row found while tabulating) is the hint. Status is OPTIMAL
only when CP-SAT proves it; with a time limit it may be FEASIBLE, reported with the bound.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autoplan.costmodels.step import Problem, estimate, limit_mib, memory_mib
from autoplan.errors import InfeasibleError, NoPlanInTimeError
from autoplan.plan import Estimate, Offload, Plan, Recompute, SolverInfo
from autoplan.search.space import candidate_plans
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
    """Candidate plans with their estimates, in candidate order."""

    plans: list[Plan]
    estimates: list[Estimate]

    @classmethod
    def build(cls, problem: Problem, pins: Pins) -> "Table":
        plans, estimates = [], []
        for plan in candidate_plans(problem.graph, world=problem.cluster.num_gpus,
                                    gpus_per_node=problem.cluster.gpus_per_node,
                                    training=problem.training, pins=pins):
            plans.append(plan)
            estimates.append(estimate(problem, plan))
        return cls(plans, estimates)

    def __len__(self) -> int:
        return len(self.plans)

    def times_us(self) -> list[int]:
        return [round(e.step_time_s * US) for e in self.estimates]

    def memories_mib(self) -> list[int]:
        return [memory_mib(e) for e in self.estimates]

    def tiebreak(self) -> list[int]:
        """Rank of each row by (tp*pp, memory, candidate order)."""
        order = sorted(range(len(self)), key=lambda r: (
            self.plans[r].tp * self.plans[r].pp, self.estimates[r].peak_memory_gib, r))
        rank = [0] * len(self)
        for position, r in enumerate(order):
            rank[r] = position
        return rank


class PlanModel:
    """The CP-SAT model over one table."""

    def __init__(self, table: Table, *, limit_mib: int, link_dimensions: bool = False) -> None:
        self.table = table
        self.model = cp_model.CpModel()
        self.pick = [self.model.new_bool_var(f"pick_{r}") for r in range(len(table))]
        self.dims: dict[str, cp_model.IntVar] = {}
        self.assumptions: dict[cp_model.IntVar, str] = {}
        self.add_choice()
        if link_dimensions:  # only needed to name pins in an infeasibility core
            self.add_table_link()
        self.add_memory_limit(limit_mib)
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
        rows = [_dims_of(p) for p in self.table.plans]
        for name in DIMENSIONS:
            self.dims[name] = self._linked(name, [row[name] for row in rows])

    def add_memory_limit(self, limit_mib: int) -> None:
        """Worst-GPU memory within the limit, as an assumption so cores can name it: a
        candidate over the limit cannot be picked while the assumption holds."""
        fits = self.model.new_bool_var("memory_fits")
        for pick, memory in zip(self.pick, self.table.memories_mib()):
            if memory > limit_mib:
                self.model.add_implication(fits, pick.Not())
        self.assumptions[fits] = f"memory per GPU <= {limit_mib / 1024:.1f} GiB"

    def add_pins(self, pins: dict[str, int], labels: dict[str, str]) -> None:
        """User pins as assumption literals."""
        for name, value in pins.items():
            literal = self.model.new_bool_var(f"pin_{name}")
            self.model.add(self.dims[name] == value).only_enforce_if(literal).with_name(f"pin_{name}")
            self.assumptions[literal] = labels[name]

    def add_objective(self) -> None:
        """Step time, then the tie-break rank."""
        n = len(self.table)
        keys = [t * n + k for t, k in zip(self.table.times_us(), self.table.tiebreak())]
        self.model.minimize(cp_model.LinearExpr.weighted_sum(self.pick, keys))

    def add_hint(self, row: int) -> None:
        for r, pick in enumerate(self.pick):
            self.model.add_hint(pick, r == row)

    def chosen(self, solver: cp_model.CpSolver) -> int:
        return next(r for r, pick in enumerate(self.pick) if solver.boolean_value(pick))

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
        """The assumptions (pins, memory limit) that together cannot hold."""
        core = solver.sufficient_assumptions_for_infeasibility()
        by_index = {lit.index: label for lit, label in self.assumptions.items()}
        return [by_index[i] for i in core if i in by_index]


def _greedy(table: Table, limit_mib: int) -> int | None:
    fitting = [r for r, m in enumerate(table.memories_mib()) if m <= limit_mib]
    return min(fitting, key=lambda r: table.estimates[r].step_time_s) if fitting else None


def solve_table(problem: Problem, pins: Pins, *, time_limit_s: float
                ) -> tuple[Plan, Estimate, SolverInfo]:
    """Tabulate the candidates, solve, and return the plan with its estimate."""
    start = time.perf_counter()
    table = Table.build(problem, pins)
    if not len(table):
        raise InfeasibleError(
            "no legal plan exists for these pins on this cluster and batch: check that the "
            "pinned degrees divide the GPU count and that the global batch divides by dp*mbs.")
    limit = limit_mib(problem)
    model = PlanModel(table, limit_mib=limit)
    hint = _greedy(table, limit)
    if hint is not None:
        model.add_hint(hint)
    remaining = max(0.1, time_limit_s - (time.perf_counter() - start))
    solver, status = model.solve(remaining)
    wall = time.perf_counter() - start
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError(explain_infeasible(table, problem))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise NoPlanInTimeError(
            f"no plan found within --time-limit {time_limit_s:g}s; raise the limit or pin "
            "more dimensions.")
    row = model.chosen(solver)
    n = len(table)
    objective = table.estimates[row].step_time_s
    bound = (solver.best_objective_bound // n) / US
    info = SolverInfo(status=solver.status_name(status), objective=objective,
                      bound=min(bound, objective), gap=max(0.0, (objective - bound) / objective),
                      wall_time_s=wall)
    logger.info("solved %d candidates in %.2fs: %s", n, wall, info.status)
    return table.plans[row], table.estimates[row], info


def explain_infeasible(table: Table, problem: Problem) -> str:
    """Which requirement cannot be met, and by how much."""
    best = min(range(len(table)), key=lambda r: table.estimates[r].peak_memory_gib)
    plan, est = table.plans[best], table.estimates[best]
    stage = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
    return (
        f"nothing fits in {est.memory_limit_gib:.1f} GiB per GPU: even the leanest of "
        f"{len(table)} candidate plans (ZeRO-{plan.zero_stage}, {plan.recompute.value} recompute, "
        f"TP={plan.tp}, PP={plan.pp}, DP={plan.dp}, micro-batch {plan.micro_batch_size}, offload "
        f"{plan.offload.value}) needs {est.peak_memory_gib:.1f} GiB on pipeline stage {stage} "
        f"({est.peak_memory_gib - est.memory_limit_gib:.1f} GiB over). Use more or larger GPUs, "
        "a shorter sequence, a smaller model, or unpin dimensions that keep memory high."
    )
