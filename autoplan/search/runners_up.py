"""The best plan of each (TP, PP) shape: one implementation for the solve report's runners-up
and ``autoplan explain``."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from autoplan.plan import Plan


def best_by_shape(rows: Iterable[int], plans: Sequence[Plan],
                  order: Callable[[int], tuple]) -> dict[tuple[int, int], int]:
    """For each (tp, pp) among ``rows``, the row that is smallest under ``order`` (the
    solver's objective key then its tie-break)."""
    best: dict[tuple[int, int], int] = {}
    for r in rows:
        shape = (plans[r].tp, plans[r].pp)
        if shape not in best or order(r) < order(best[shape]):
            best[shape] = r
    return best


def entry_limit(known: tuple | None, ranked: list[tuple], count: int) -> tuple | None:
    """How far a shape must be completed for the runners-up: to its best key so far
    (``known``), or to the ``count``-th smallest key of the shapes already ranked
    (``ranked``, sorted) when that is lower. A shape with nothing left under it cannot
    enter (the ranked keys only fall as more shapes are ranked); one that finds a row under
    it is then completed exactly, since its best so far is then the lower of the two."""
    cutoff = ranked[count - 1] if len(ranked) >= count else None
    if known is None or cutoff is None:
        return known if cutoff is None else cutoff
    return min(known, cutoff)
