"""The Pareto front is exactly the set of non-dominated points (property test)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoplan.sweep import pareto_mask

values = st.integers(min_value=0, max_value=6).map(float)
vectors = st.lists(st.one_of(st.none(), st.tuples(values, values)), max_size=25)
vectors3 = st.lists(st.tuples(values, values, values), max_size=20)


def dominates(b, a) -> bool:
    return all(y <= x for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b))


@given(vectors)
def test_front_holds_no_dominated_point(points):
    mask = pareto_mask(points)
    for a, on in zip(points, mask):
        if on:
            assert a is not None
            assert not any(b is not None and dominates(b, a) for b in points)


@given(vectors)
def test_every_point_off_the_front_is_dominated_by_one_on_it(points):
    mask = pareto_mask(points)
    front = [p for p, on in zip(points, mask) if on]
    for a, on in zip(points, mask):
        if not on and a is not None:
            assert any(dominates(b, a) for b in front)


@given(vectors3)
def test_any_number_of_objectives(points):
    mask = pareto_mask(points)
    assert (not points) or any(mask)
    for a, on in zip(points, mask):
        assert on == (not any(dominates(b, a) for b in points))
