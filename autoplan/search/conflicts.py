"""Which requirements conflict when nothing is eligible.

The relaxed table holds every candidate of the unpinned space (every DP degree, the whole
cluster, no bounds), evaluated in full, plus the pinned space where a pin reaches outside it
(a --tp across nodes). Each requirement (a pin, one side of a bound, max_gpus, the
throughput, the memory limit) becomes an assumption literal that forbids the rows violating
it; CP-SAT's ``sufficient_assumptions_for_infeasibility`` names a conflicting set, which is
then shrunk to a minimal one by dropping requirements that are not needed for the conflict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ortools.sat.python import cp_model

from autoplan.costmodels.step import Problem
from autoplan.search.objective import meets_throughput
from autoplan.search.solver import (
    NO_LEGAL_PLAN, PlanModel, Table, _dims_of, explain_infeasible, pin_values,
)
from autoplan.search.space import divisors
from autoplan.training import Bounds, Objective, Pins

GIB = 2**30


@dataclass(frozen=True)
class Requirement:
    label: str
    violated: Callable[[int], bool]
    memory: bool = False


def relaxed_table(problems: list[Problem], pins: Pins, objective: Objective) -> Table:
    table = Table.build(problems, Pins(), objective=objective, prune=False, every_dp=True)
    gpus_per_node = problems[0].cluster.gpus_per_node
    if pins.tp is not None and pins.tp not in divisors(gpus_per_node):
        extra = Table.build(problems, Pins(tp=pins.tp), objective=objective, prune=False,
                            every_dp=True)
        for plan, source in zip(extra.plans, extra.sources):
            table.add(plan, source)
    return table


def _pin_label(name: str, value) -> str:
    if name == "sp":
        return "--sp" if value else "--no-sp"
    return f"--{name} {getattr(value, 'value', value)}"


def requirements(table: Table, pins: Pins, bounds: Bounds | None,
                 max_gpus: int | None) -> list[Requirement]:
    out = []
    encoded = pin_values(pins)
    for name, value in pins.pinned().items():
        out.append(Requirement(_pin_label(name, value), lambda r, n=name, v=encoded[name]:
                               _dims_of(table.plans[r])[n] != v))
    for key, label in (bounds.labels() if bounds else {}).items():
        name, side = key.split(".")
        limit = getattr(getattr(bounds, name), side)
        dim = "micro_batch_size" if name == "mbs" else name
        out.append(Requirement(f"{label} (bounds)", lambda r, d=dim, s=side, x=limit: (
            getattr(table.plans[r], d) < x if s == "min" else getattr(table.plans[r], d) > x)))
    if max_gpus is not None:
        out.append(Requirement(f"max_gpus {max_gpus}",
                               lambda r: table.plans[r].world_size > max_gpus))
    if table.objective.min_tokens_per_s is not None:
        out.append(Requirement(
            f"at least {table.objective.min_tokens_per_s:,.0f} tokens/s",
            lambda r: not meets_throughput(table.objective, table.step_times_s[r], table.tokens(r))))
    limit_gib = table.problem.mem_limit_bytes / GIB
    out.append(Requirement(f"{_gib(limit_gib)} GiB per GPU", lambda r: not table.fits(r),
                           memory=True))
    return out


def core(table: Table, reqs: list[Requirement]) -> list[Requirement] | None:
    """A minimal set of requirements that no row meets together; None if all can hold."""
    model = PlanModel(table, list(range(len(table))))
    model.add_table_link()
    literals = {}
    for req in reqs:
        bad = [model.pick[r] for r in range(len(table)) if req.violated(r)]
        literal = model.model.new_bool_var(f"require_{len(literals)}")
        model.model.add(sum(bad) == 0).only_enforce_if(literal).with_name(req.label)
        model.assumptions[literal] = req.label
        literals[req.label] = req
    solver, status = model.solve(time_limit_s=30)
    if status != cp_model.INFEASIBLE:
        return None
    found = [literals[label] for label in model.conflict(solver)]
    for req in list(found):  # deletion: keep only what the conflict needs
        rest = [q for q in found if q is not req]
        if not _satisfiable(table, rest):
            found = rest
    return found


def _satisfiable(table: Table, reqs: list[Requirement]) -> bool:
    return any(not any(q.violated(r) for q in reqs) for r in range(len(table)))


def _meeting(table: Table, reqs: list[Requirement]) -> list[int]:
    return [r for r in range(len(table)) if not any(q.violated(r) for q in reqs)]


def explain_conflict(problems: list[Problem], pins: Pins, *, objective: Objective,
                     bounds: Bounds | None, max_gpus: int | None) -> str:
    """Name the requirements that together admit no plan, with the numbers."""
    table = relaxed_table(problems, pins, objective)
    if not len(table):
        return NO_LEGAL_PLAN
    reqs = requirements(table, pins, bounds, max_gpus)
    found = core(table, reqs)
    if found is None:  # all hold together, but on a plan the time search's space leaves out
        row = min(_meeting(table, reqs), key=table.order)
        return (f"no plan in the searched space meets these requirements (for speed it keeps "
                f"the two largest DP degrees that fit), but {_summary(table, row)} does; pin "
                f"--dp {table.plans[row].dp} to get it.")
    if not found:
        return NO_LEGAL_PLAN
    if [q.memory for q in found] == [True]:
        return explain_infeasible(table, table.problem)
    others = [q for q in found if not q.memory]
    names = " and ".join(q.label for q in others)
    if any(q.memory for q in found):
        lean = min(_meeting(table, others), key=lambda r: table.peak_bytes[r])
        est = table.estimate(lean)
        stage = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
        text = (f"{names} together with {_gib(est.memory_limit_gib)} GiB per GPU: the leanest "
                f"such plan ({_summary(table, lean)}) needs {_gib(est.peak_memory_gib)} GiB on "
                f"stage {stage}")
    else:
        text = f"{names} cannot all hold: no candidate plan meets them together"
    drop = others[0]
    rows = _meeting(table, [q for q in reqs if q is not drop])
    if rows:
        best = min(rows, key=table.order)
        est = table.estimate(best)
        text += (f"; without {drop.label} the best plan ({_summary(table, best)}) fits at "
                 f"{_gib(est.peak_memory_gib)} GiB and takes {est.step_time_s:.3f} s")
    return text + ". Relax one of these."


def _summary(table: Table, row: int) -> str:
    p = table.plans[row]
    return (f"TP={p.tp}, PP={p.pp}, DP={p.dp}, ZeRO-{p.zero_stage}, "
            f"{p.recompute.value} recompute, mbs {p.micro_batch_size}, offload {p.offload.value}")


def _gib(value: float) -> str:
    """GiB with enough digits to tell small models' figures apart."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3f}"
