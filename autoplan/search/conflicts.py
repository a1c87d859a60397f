"""Which requirements conflict when nothing is eligible.

Each requirement (a pin, one side of a bound, max_gpus, the throughput, the memory limit) is
dropped in turn: when the others still admit no plan it is not needed for the conflict and
stays dropped (deletion), so what is left is a minimal conflicting set. Whether a set of
requirements admits a plan is a table build under exactly those requirements, over every DP
degree (plans the time search's DP dominance leaves out count too): screened as the solver's
(families of shapes whose memory-leanest members do not fit are rejected after a few
estimates) and stopping at the first bound beyond the best fitting plan, so each build takes
seconds even for a 405B model on 8,192 GPUs. The builds that admit no plan hold the leanest
plans that meet their requirements, the one without the first requirement holds the best plan
once that requirement is relaxed: the message quotes both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from autoplan.costmodels.problem import Problem
from autoplan.plan import one_line
from autoplan.search.solver import NO_LEGAL_PLAN, Table, explain_infeasible
from autoplan.training import Bounds, Objective, Pins, Range

GIB = 2**30
UNLIMITED_BYTES = float(2**62)
EXPLAIN_BUDGET_S = 10.0
"""Seconds the table builds of one explanation may take together; requirements not tried by
then stay in the set (it still conflicts, maybe not minimally) and the message says so."""


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


def _pin_label(name: str, value) -> str:
    if name == "sp":
        return "--sp" if value else "--no-sp"
    return f"--{name} {getattr(value, 'value', value)}"


def requirements(pins: Pins, bounds: Bounds | None, max_gpus: int | None,
                 objective: Objective, limit_bytes: float) -> list[Requirement]:
    """Every requirement of the solve, in the order the deletion tries them."""
    out = []
    for name, value in pins.pinned().items():
        out.append(Requirement(_pin_label(name, value),
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


class Builds:
    """Table builds under subsets of the requirements, each built once, all of them by the
    ``deadline`` (a ``time.perf_counter()`` value)."""

    def __init__(self, problems: list[Problem], objective: Objective, deadline: float) -> None:
        self.problems = problems
        self.unlimited = [replace(p, mem_limit_bytes=UNLIMITED_BYTES) for p in problems]
        self.objective = objective
        self.deadline = deadline
        self.tables: dict[tuple[str, ...], Table] = {}

    def table(self, reqs: list[Requirement]) -> Table:
        key = tuple(q.label for q in reqs)
        if key not in self.tables:
            settings = Settings()
            for q in reqs:
                q.apply(settings)
            bounds = Bounds(**{n: Range(**r) for n, r in settings.bounds.items()}) \
                if settings.bounds else None
            objective = self.objective.model_copy(
                update={"min_tokens_per_s": settings.min_tokens_per_s})
            self.tables[key] = Table.build(
                self.problems if settings.memory else self.unlimited, Pins(**settings.pins),
                objective=objective, bounds=bounds, max_gpus=settings.max_gpus, every_dp=True,
                deadline=self.deadline)
        return self.tables[key]

    def admits(self, reqs: list[Requirement]) -> bool | None:
        """Whether some plan meets ``reqs``; None when the deadline cut the build short
        before one was found."""
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
        return explain_infeasible(builds.table(found), problems[0])
    others = [q for q in found if not q.memory]
    names = " and ".join(q.label for q in others)
    table = builds.table(found)
    if any(q.memory for q in found) and len(table):
        lean = min(range(len(table)), key=lambda r: table.peak_bytes[r])
        est = table.estimate(lean)
        stage = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
        text = (f"{names} together with {_gib(est.memory_limit_gib)} GiB per GPU: the leanest "
                f"such plan ({one_line(table.plans[lean])}) needs {_gib(est.peak_memory_gib)} "
                f"GiB on stage {stage}")
    else:
        text = f"{names} cannot all hold: no candidate plan meets them together"
    drop = others[0]
    relaxed = builds.table([q for q in reqs if q is not drop])
    if relaxed.eligible():
        best = min(relaxed.eligible(), key=relaxed.order)
        est = relaxed.estimate(best)
        text += (f"; without {drop.label} the best plan ({one_line(relaxed.plans[best])}) fits "
                 f"at {_gib(est.peak_memory_gib)} GiB and takes {est.step_time_s:.3f} s")
    if not minimal:
        text += " (not every requirement was tried within the time allowed)"
    return text + ". Relax one of these."


def _gib(value: float) -> str:
    """GiB with enough digits to tell small models' figures apart."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3f}"
