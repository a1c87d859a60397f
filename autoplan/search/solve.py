"""One search, end to end: the memory screen (``conflicts``), the table and its CP-SAT model
(``solver``), the chosen row's estimate and the solver's report. Kept apart from ``solver`` so
that ``conflicts``, which builds tables of its own, and ``solver`` import one way."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from autoplan.search.cpsat import cp_model  # first: before anything imports it with pandas
from autoplan.capabilities import RUNTIMES
from autoplan.costmodels.problem import Problem
from autoplan.errors import InfeasibleError, NoPlanInTimeError
from autoplan.plan import Estimate, Plan, SolverInfo
from autoplan.search.conflicts import UNEXPLAINED, conflict_if_nothing_fits, explain_conflict
from autoplan.search.objective import from_key as objective_from_key
from autoplan.search.objective import value as objective_value
from autoplan.search.solver import PlanModel
from autoplan.search.table import Table
from autoplan.training import Bounds, Objective, ObjectiveTerm, Pins

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Solution:
    """The chosen row of a table, with its estimate and the solver's report."""

    table: Table
    row: int
    estimate: Estimate
    info: SolverInfo

    @property
    def plan(self) -> Plan:
        return self.table.plans[self.row]

    @property
    def problem(self) -> Problem:
        return self.table.problems[self.table.sources[self.row]]


def solve_table(problem: Problem, pins: Pins, *, time_limit_s: float, num_workers: int = 1
                ) -> tuple[Plan, Estimate, SolverInfo]:
    """Tabulate the candidates, solve for the fastest with ``num_workers`` CP-SAT workers, and
    return the plan with its estimate (the same plan for any ``num_workers``: see the
    tie-break above)."""
    solution = solve_search(problem, pins, time_limit_s=time_limit_s, num_workers=num_workers)
    return solution.plan, solution.estimate, solution.info


def solve_search(problems: Problem | list[Problem], pins: Pins, *, time_limit_s: float,
                 objective: Objective | None = None, bounds: Bounds | None = None,
                 max_gpus: int | None = None, num_workers: int = 1,
                 explain: bool = True) -> Solution:
    """Tabulate the candidates of every problem (one per allowed global batch), solve for the
    objective with ``num_workers`` CP-SAT workers, and return the chosen row with its table
    (for runners-up). ``explain=False`` when only whether a plan exists matters (the ZeRO-2 /
    ZeRO-3 comparison): the infeasible error then says so without naming the conflict, which
    takes more searches.

    Where nothing fits, the ZeRO stages the runtime searches only when asked for
    (capabilities ``asked_zero_stages``: Megatron-FSDP's ZeRO-2) are searched before the
    refusal stands, unless ``pins`` fix the stage: a setup that runs is not refused for a mode
    the search holds back."""
    start = time.perf_counter()
    problems = [problems] if isinstance(problems, Problem) else list(problems)
    search = dict(objective=objective or Objective(), bounds=bounds, max_gpus=max_gpus,
                  num_workers=num_workers, explain=explain)
    try:
        return _search(problems, pins, time_limit_s=time_limit_s, **search)
    except InfeasibleError as refused:
        asked = () if pins.zero is not None else (
            RUNTIMES[problems[0].training.runtime].asked_zero_stages)
        for zero in asked:
            left = time_limit_s - (time.perf_counter() - start)
            logger.info("nothing fits at the ZeRO stages searched; searching ZeRO-%d", zero)
            try:  # its own refusal is not reported: no explanation to search for
                return _search(problems, pins.model_copy(update={"zero": zero}),
                               time_limit_s=left, **(search | {"explain": False}))
            except InfeasibleError:
                continue
        raise refused


def _search(problems: list[Problem], pins: Pins, *, time_limit_s: float, objective: Objective,
            bounds: Bounds | None, max_gpus: int | None, num_workers: int,
            explain: bool) -> Solution:
    """:func:`solve_search` over the ZeRO stages the runtime searches (or ``pins`` fix)."""
    start = time.perf_counter()
    conflict = conflict_if_nothing_fits(problems, pins, objective=objective, bounds=bounds,
                                        max_gpus=max_gpus, explain=explain)
    if conflict is not None:  # from memory lower bounds alone, before any step-time search
        raise InfeasibleError(conflict)
    table = Table.build(problems, pins, deadline=start + time_limit_s, objective=objective,
                        bounds=bounds, max_gpus=max_gpus)
    if not table.eligible() and table.open_bound_s < math.inf:
        raise NoPlanInTimeError(
            f"no plan that fits was found within --time-limit {time_limit_s:g}s; raise the "
            "limit or pin more dimensions.")
    rows = table.eligible()
    if not rows:
        raise InfeasibleError(explain_conflict(table.problems, pins, objective=objective,
                                               bounds=bounds, max_gpus=max_gpus)
                              if explain else UNEXPLAINED)
    model = PlanModel(table, rows)
    best = min(rows, key=table.order)
    model.add_hint(best)
    remaining = max(0.1, time_limit_s - (time.perf_counter() - start))
    solver, status, first_bound = model.solve_lexicographic(remaining, num_workers=num_workers)
    wall = time.perf_counter() - start
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        row, name = model.chosen(solver), solver.status_name(status)
    elif status == cp_model.UNKNOWN:  # time limit before CP-SAT's first solution: the hint
        row, name, first_bound = best, "FEASIBLE", 0.0
    else:
        raise NoPlanInTimeError(
            f"no plan found within --time-limit {time_limit_s:g}s; raise the limit or pin "
            "more dimensions.")
    chosen = table.estimate(row)
    info = _info(table, row, name, first_bound // 1, wall)
    logger.info("solved %d rows (%d eligible, %d candidate groups never evaluated) in %.2fs: %s",
                len(table), len(rows), len(table.unexpanded), wall, info.status)
    return Solution(table, row, chosen, info)


def _info(table: Table, row: int, name: str, bound_key: float, wall: float) -> SolverInfo:
    """The report in the primary term's unit; the bound is in seconds for time."""
    objective, per_token = table.objective, table.per_token
    value, unit = objective_value(objective, table.step_time(row), table.plans[row].world_size,
                                  table.tokens(row), per_token=per_token)
    bound = objective_from_key(objective, bound_key, per_token=per_token)
    open_bound_s = min(table.open_bound_s, table.unproven_bound_s)
    if open_bound_s < math.inf:  # optimal among what was evaluated (and split), not proven
        name = "FEASIBLE"
        bound = (min(bound, open_bound_s)
                 if objective.primary is ObjectiveTerm.TIME and not per_token else 0.0)
    # Keys are whole µs (or units of the objective): a proven optimum is exact at that
    # resolution, so its bound is the value itself rather than the value rounded down.
    bound = value if name == "OPTIMAL" else min(bound, value)
    return SolverInfo(status=name, objective=value, bound=bound,
                      gap=max(0.0, (value - bound) / value) if value else 0.0, wall_time_s=wall,
                      objective_terms=tuple(t.value for t in objective.terms),
                      objective_unit=unit)
