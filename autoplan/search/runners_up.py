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
