"""Integer keys of the objectives, shared by the solver and the brute-force reference.

Every key is a function of a plan's step time, GPU count and tokens per step. Within one
(shape, stages) group GPUs and tokens are fixed, so every key is nondecreasing in step time:
the group's step-time lower bound gives a lower bound on its key, which keeps the solver's
pruning exact for every objective (see ``table.Table.build``).

Scales (chosen once): TIME in µs of step time, or ps per token when the global batch varies
(the step times of different batches are not comparable); COST in GPU-ps per token; GPUS in
GPUs.
"""

from __future__ import annotations

from autoplan.training import Objective, ObjectiveTerm

US = 1e6
PS = 1e12


def term_key(term: ObjectiveTerm, step_s: float, world: int, tokens: int, *,
             per_token: bool) -> int:
    if term is ObjectiveTerm.TIME:
        return round(step_s * PS / tokens) if per_token else round(step_s * US)
    if term is ObjectiveTerm.COST:
        return round(world * step_s * PS / tokens)
    return world


def key(objective: Objective, step_s: float, world: int, tokens: int, *,
        per_token: bool = False) -> tuple[int, ...]:
    """The lexicographic key of one plan (smaller is better)."""
    return tuple(term_key(t, step_s, world, tokens, per_token=per_token) for t in objective.terms)


def meets_throughput(objective: Objective, step_s: float, tokens: int) -> bool:
    return objective.min_tokens_per_s is None or tokens / step_s >= objective.min_tokens_per_s


def value(objective: Objective, step_s: float, world: int, tokens: int, *,
          per_token: bool = False) -> tuple[float, str]:
    """The primary term in its reported unit: s (step), s/Mtoken, $/Mtoken or GPUs."""
    term = objective.primary
    if term is ObjectiveTerm.TIME:
        return (step_s / tokens * 1e6, "s/Mtoken") if per_token else (step_s, "s")
    if term is ObjectiveTerm.COST:
        return world * step_s / 3600 * objective.price_per_gpu_hour / tokens * 1e6, "$/Mtoken"
    return float(world), "GPUs"


def from_key(objective: Objective, primary_key: float, *, per_token: bool = False) -> float:
    """A (possibly fractional) primary key back in the reported unit: for the solver's bound."""
    term = objective.primary
    if term is ObjectiveTerm.TIME:
        return primary_key / PS * 1e6 if per_token else primary_key / US
    if term is ObjectiveTerm.COST:
        return primary_key / PS / 3600 * objective.price_per_gpu_hour * 1e6
    return primary_key
