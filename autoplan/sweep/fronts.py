"""The Pareto fronts a sweep marks (all objectives minimized), named once for the sweep and
its figures."""

from __future__ import annotations

FRONTS = ("time_vs_gpus", "cost_vs_time", "headroom_vs_speed")


def pareto_mask(values: list[tuple[float, ...] | None]) -> list[bool]:
    """True for each vector (all objectives minimized) no other vector dominates; None (an
    infeasible point) is never on the front. Equal vectors do not dominate each other."""
    out = []
    for i, a in enumerate(values):
        if a is None:
            out.append(False)
            continue
        dominated = any(
            b is not None and j != i and all(y <= x for x, y in zip(a, b))
            and any(y < x for x, y in zip(a, b))
            for j, b in enumerate(values))
        out.append(not dominated)
    return out
