"""Which requirements conflict when nothing is eligible.

Each requirement (a pin, one side of a bound, max_gpus, the throughput, the memory limit) is
dropped in turn: when the others still admit no plan it is not needed for the conflict and
stays dropped (deletion), so what is left is a minimal conflicting set. Whether a set of
requirements without a throughput admits a plan is a question about memory alone, answered
without any step-time search (``screen``): the memory-leanest plan of each family of shapes
(``space.leanest_plans``: largest DP, micro-batch 1, the leanest switches of each ZeRO stage,
per stage layout), the families most split first, up to the first that fits; if none does,
no plan under those requirements fits. That is about a thousand estimates for a 405B model
on 8,192 GPUs with little pinned, a second or two, and it also answers, before the solver's
search, whether the solve's own requirements admit anything (``conflict_if_nothing_fits``).
A set with a throughput requirement takes a table build (step times are needed). The
screens that admit no plan hold the leanest plans that meet their requirements, and a search
without one of the conflicting requirements the best plan once it is relaxed: the message
quotes both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from autoplan.costmodels.problem import Problem
from autoplan.degrees import DEGREE
from autoplan.plan import Plan, one_line
from autoplan.search.solver import NO_LEGAL_PLAN, explain_infeasible
from autoplan.search.table import UNEXPLAINED, Table
from autoplan.search.space import Shape, leanest_members, leanest_plans, shapes, stage_variants
from autoplan.training import DEFAULT_PLACEMENT, Bounds, Objective, Pins, Range, TrainingSpec
from autoplan.units import format_excess, format_seconds

GIB = 2**30
UNLIMITED_BYTES = float(2**62)
EXPLAIN_BUDGET_S = 30.0
"""Seconds the screens and table builds of one explanation may take together; requirements
not tried by then stay in the set (it still conflicts, maybe not minimally) and the message
says so. A ceiling, not a target: tests/search/test_fast_infeasible.py's Llama 3 405B
conflict on 8,192 H100 takes 10.5 s of CPU in all (import and trace included), and a 10 s
ceiling cut its explanation short on a loaded 2-core machine, where the message then depends
on the load."""


@dataclass(frozen=True)
class Requirement:
    """One requirement and how to impose it on a table build (``apply`` edits the build's
    settings: pins, bounds, max_gpus, objective, memory)."""

    label: str
    apply: Callable[["Settings"], None]
    memory: bool = False


@dataclass
class Settings:
    """The arguments of one table build, filled by the requirements kept."""

    pins: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)
    max_gpus: int | None = None
    min_tokens_per_s: float | None = None
    memory: bool = False


def requirements(pins: Pins, bounds: Bounds | None, max_gpus: int | None,
                 objective: Objective, limit_bytes: float) -> list[Requirement]:
    """Every requirement of the solve, in the order the deletion tries them."""
    out = []
    for name, value in pins.pinned().items():
        out.append(Requirement(DEGREE[name].given(value),
                               lambda s, n=name, v=value: s.pins.__setitem__(n, v)))
    for key, label in (bounds.labels() if bounds else {}).items():
        name, side = key.split(".")
        limit = getattr(getattr(bounds, name), side)
        out.append(Requirement(f"{label} (bounds)", lambda s, n=name, d=side, x=limit:
                               s.bounds.setdefault(n, {}).__setitem__(d, x)))
    if max_gpus is not None:
        out.append(Requirement(f"max_gpus {max_gpus}",
                               lambda s: setattr(s, "max_gpus", max_gpus)))
    if objective.min_tokens_per_s is not None:
        out.append(Requirement(f"at least {objective.min_tokens_per_s:,.0f} tokens/s",
                               lambda s: setattr(s, "min_tokens_per_s",
                                                 objective.min_tokens_per_s)))
    out.append(Requirement(f"{_gib(limit_bytes / GIB)} GiB per GPU",
                           lambda s: setattr(s, "memory", True), memory=True))
    return out


def _leanest_shape_pins(pins: Pins, bounds: Bounds | None, training: TrainingSpec) -> Pins:
    """The pins with micro-batch 1 and the default placement where neither is pinned (nor the
    micro-batch bounded): a family's memory-leanest shape has the smallest micro-batch, which
    every larger legal one implies is legal too, and placement changes no memory
    (``space.leanest_members``), so the other shapes need not be enumerated. An optimizer that
    steps in backward has one legal micro-batch per DP degree (the whole rank's batch), so
    there the micro-batch stays free."""
    mbs_free = (pins.mbs is None and (bounds is None or bounds.mbs is None)
                and not training.optimizer_in_backward)
    return pins.model_copy(update={"mbs": 1 if mbs_free else pins.mbs,
                                   "placement": pins.placement or DEFAULT_PLACEMENT})


def _most_split_first(members: list[Shape]) -> tuple:
    """Families that split the model over more GPUs need less memory each: try them first."""
    shape = members[0]
    return -(shape.tp * shape.pp * shape.cp * shape.ep), shape.vpp, shape.tp, shape.pp, shape.cp


def _leanest_by_family(problem: Problem, pins: Pins, bounds: Bounds | None,
                       max_gpus: int | None) -> Iterator[list[Plan]]:
    """Per family of shapes and stage layout meeting the requirements, its memory-leanest
    plans (``space.leanest_plans``), the most split families first."""
    world = min(problem.cluster.num_gpus, max_gpus or problem.cluster.num_gpus)
    candidates = shapes(problem.graph, world=world, gpus_per_node=problem.cluster.gpus_per_node,
                        training=problem.training, pins=_leanest_shape_pins(pins, bounds, problem.training),
                        bounds=bounds, every_dp=True)
    layouts: dict[tuple[int, int], list] = {}
    for members in sorted(leanest_members(candidates).values(), key=_most_split_first):
        pp, vpp = members[0].pp, members[0].vpp
        if (pp, vpp) not in layouts:
            layouts[(pp, vpp)] = stage_variants(problem.graph, pp, vpp)
        for stages in layouts[(pp, vpp)]:
            yield leanest_plans(members, stages, graph=problem.graph, training=problem.training,
                                pins=pins)


def screen(problems: list[Problem], pins: Pins, *, bounds: Bounds | None,
           max_gpus: int | None, objective: Objective, deadline: float) -> Table:
    """Whether any plan meeting ``pins``, ``bounds`` and ``max_gpus`` fits in memory, from the
    families' memory-leanest plans alone: a table of those plans up to the first that fits
    (then eligible), or of every family's when none fits. Its ``open_bound_s`` is 0 when the
    ``deadline`` cut it short (then nothing is known). No throughput: ``objective`` must not
    ask for one."""
    table = Table(problems, objective.model_copy(update={"min_tokens_per_s": None}))
    for source, problem in enumerate(problems):
        for plans in _leanest_by_family(problem, pins, bounds, max_gpus):
            if time.perf_counter() > deadline:
                table.open_bound_s = 0.0
                return table
            for plan in plans:
                table.add(plan, source)
                if table.is_eligible(len(table) - 1):
                    return table
    return table


class Builds:
    """Screens (or, with a throughput, table builds) under subsets of the requirements, each
    made once, all of them by the ``deadline`` (a ``time.perf_counter()`` value)."""

    def __init__(self, problems: list[Problem], objective: Objective, deadline: float) -> None:
        self.problems = problems
        self.unlimited = [replace(p, mem_limit_bytes=UNLIMITED_BYTES) for p in problems]
        self.objective = objective
        self.deadline = deadline
        self.tables: dict[tuple[str, ...], Table] = {}

    def _settings(self, reqs: list[Requirement]) -> tuple[Settings, Bounds | None, Objective]:
        settings = Settings()
        for q in reqs:
            q.apply(settings)
        bounds = Bounds(**{n: Range(**r) for n, r in settings.bounds.items()}) \
            if settings.bounds else None
        objective = self.objective.model_copy(
            update={"min_tokens_per_s": settings.min_tokens_per_s})
        return settings, bounds, objective

    def table(self, reqs: list[Requirement]) -> Table:
        """The screen of ``reqs`` (a table build over every DP degree when they ask for a
        throughput: that needs step times)."""
        key = tuple(q.label for q in reqs)
        if key not in self.tables:
            settings, bounds, objective = self._settings(reqs)
            problems = self.problems if settings.memory else self.unlimited
            if settings.min_tokens_per_s is None:
                self.tables[key] = screen(problems, Pins(**settings.pins), bounds=bounds,
                                          max_gpus=settings.max_gpus, objective=objective,
                                          deadline=self.deadline)
            else:
                self.tables[key] = Table.build(
                    problems, Pins(**settings.pins), objective=objective, bounds=bounds,
                    max_gpus=settings.max_gpus, every_dp=True, deadline=self.deadline)
        return self.tables[key]

    def best(self, reqs: list[Requirement]) -> tuple[Table, int, bool] | None:
        """The solver's best plan under ``reqs`` (its table, row and whether the search
        finished), else the screen's plan that fits (not the best); None if neither has one."""
        settings, bounds, objective = self._settings(reqs)
        table = Table.build(self.problems if settings.memory else self.unlimited,
                            Pins(**settings.pins), objective=objective, bounds=bounds,
                            max_gpus=settings.max_gpus, deadline=self.deadline)
        if table.eligible():
            return (table, min(table.eligible(), key=table.order),
                    table.open_bound_s == float("inf"))
        screened = self.table(reqs)
        fitting = screened.eligible()
        return (screened, min(fitting, key=screened.order), False) if fitting else None

    def admits(self, reqs: list[Requirement]) -> bool | None:
        """Whether some plan meets ``reqs``; None when the deadline cut the screen or build
        short before one was found."""
        table = self.table(reqs)
        if table.eligible():
            return True
        return None if table.open_bound_s < float("inf") else False


def minimal_conflict(builds: Builds, reqs: list[Requirement]) -> tuple[list[Requirement], bool]:
    """A conflicting subset of ``reqs`` (which admit no plan together), and whether it is
    minimal (False when the deadline left a requirement untried: it then stays in)."""
    found, minimal = list(reqs), True
    for req in reqs:
        rest = [q for q in found if q is not req]
        admits = builds.admits(rest) if time.perf_counter() < builds.deadline else None
        if admits is False:
            found = rest
        minimal = minimal and admits is not None
    return found, minimal


def explain_conflict(problems: list[Problem], pins: Pins, *, objective: Objective,
                     bounds: Bounds | None, max_gpus: int | None) -> str:
    """Name the requirements that together admit no plan, with the numbers."""
    builds = Builds(problems, objective, time.perf_counter() + EXPLAIN_BUDGET_S)
    reqs = requirements(pins, bounds, max_gpus, objective, problems[0].mem_limit_bytes)
    return _explain(builds, reqs)


def conflict_if_nothing_fits(problems: list[Problem], pins: Pins, *, objective: Objective,
                             bounds: Bounds | None, max_gpus: int | None,
                             explain: bool = True) -> str | None:
    """Before any step-time search: when no plan meeting the pins, bounds and GPU budget fits
    in memory (``screen``), the explanation of the conflict (``UNEXPLAINED`` unless
    ``explain``: naming it takes more screens and searches); None when one fits, when the
    objective asks for a throughput (that takes step times) or when the screen ran out of
    time."""
    if objective.min_tokens_per_s is not None:
        return None
    builds = Builds(problems, objective, time.perf_counter() + EXPLAIN_BUDGET_S)
    reqs = requirements(pins, bounds, max_gpus, objective, problems[0].mem_limit_bytes)
    if builds.admits(reqs) is not False:
        return None
    return _explain(builds, reqs) if explain else UNEXPLAINED


def _explain(builds: Builds, reqs: list[Requirement]) -> str:
    """The message for ``reqs``, which admit no plan in the solver's space."""
    everything = builds.table(reqs)
    if everything.eligible():  # all hold, on a plan the time search's space leaves out
        row = min(everything.eligible(), key=everything.order)
        return (f"no plan in the searched space meets these requirements (for speed it keeps "
                f"the two largest DP degrees that fit), but {one_line(everything.plans[row])} "
                f"does; pin --dp {everything.plans[row].dp} to get it.")
    found, minimal = minimal_conflict(builds, reqs)
    if not found:
        return NO_LEGAL_PLAN
    if [q.memory for q in found] == [True]:
        return explain_infeasible(builds.table(found), builds.problems[0])
    others = [q for q in found if not q.memory]
    names = " and ".join(q.label for q in others)
    table = builds.table(found)
    if any(q.memory for q in found) and len(table):
        lean = min(range(len(table)), key=lambda r: table.peak_bytes[r])
        est = table.estimate(lean)
        stage = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
        text = (f"{names} together with {_gib(est.memory_limit_gib)} GiB per GPU: the leanest "
                f"such plan ({one_line(table.plans[lean])}) needs {_gib(est.peak_memory_gib)} "
                f"GiB on stage {stage} "
                f"({format_excess(est.peak_memory_gib, est.memory_limit_gib)} over)")
    else:
        text = f"{names} cannot all hold: no candidate plan meets them together"
    text += _relaxed(builds, reqs, others)
    if not minimal:
        text += " (not every requirement was tried within the time allowed)"
    return text + ". Relax one of these."


def _relaxed(builds: Builds, reqs: list[Requirement], others: list[Requirement]) -> str:
    """``; without --x N the best plan (...) fits at ... GiB and takes ... s`` for the first of
    the conflicting requirements whose removal from all of ``reqs`` admits a plan; empty
    when none does (or time ran out)."""
    for drop in others:
        rest = [q for q in reqs if q is not drop]
        if time.perf_counter() >= builds.deadline or not builds.admits(rest):
            continue
        found = builds.best(rest)
        if found is None:
            continue
        table, row, best = found
        est = table.estimate(row)
        which = "the best plan" if best else "a plan that fits"
        return (f"; without {drop.label} {which} ({one_line(table.plans[row])}) fits at "
                f"{_gib(est.peak_memory_gib)} GiB and takes {format_seconds(est.step_time_s)}")
    return ""


def _gib(value: float) -> str:
    """GiB with enough digits to tell small models' figures apart."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3f}"
