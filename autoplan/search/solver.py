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

from autoplan.search.cpsat import cp_model

from autoplan.costmodels.problem import Problem
from autoplan.plan import one_line
from autoplan.search.table import Table
from autoplan.units import format_excess, gib_digits

logger = logging.getLogger(__name__)

US = 1e6
RANDOM_SEED = 0
PROBING_LEVEL = 0
"""The model is one exactly-one over prepared rows: probing only costs time (1.4 s -> 0.26 s on
9,000 rows) and cannot tighten a bound that the LP relaxation already makes exact."""


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
