"""Interleaved (virtual pipeline) 1F1B memory per pipeline rank: the order of a rank's
forwards and backwards (pipeline.schedule_order) listed by hand from megatron-core's rules and
checked against megatron-core's own schedule functions, the chunk-micro-batches in flight at
each backward (pipeline.in_flight_moments, the closed form the search prices) counted by hand,
and that closed form against the allocator replay of the same order
(step_allocations.replay_schedule)."""

from __future__ import annotations

import types

import pytest

from autoplan.costmodels.memory import in_flight_chunks
from autoplan.costmodels.pipeline import in_flight_moments, schedule_order, warmup_forwards
from autoplan.costmodels.step_allocations import LayerTensors, replay_schedule

MIB = 2**20
F, B = True, False


def test_pp2_vpp2_order_as_megatron_core_runs_it():
    """pp 2, vpp 2, 4 micro-batches (groups of pp = 2 per chunk). Rank 0's warm-up is
    (pp - 0 - 1) * 2 + (vpp - 1) * pp = 4 forwards: chunk 0 of micro-batches 0, 1, then chunk
    1 of 0, 1. Steady state (forward, then backward, backwards from the last chunk): F c0
    mb2, B c1 mb0; F c0 mb3, B c1 mb1; F c1 mb2, B c0 mb0; F c1 mb3, B c0 mb1; cool-down
    B c1 mb2, B c1 mb3, B c0 mb2, B c0 mb3. Rank 1: warm-up (vpp - 1) * pp = 2 (chunk 0 of
    mb 0, 1), then each forward of chunk 1 is followed by that micro-batch's backward."""
    assert schedule_order(0, pp=2, vpp=2, num_microbatches=4) == (
        (F, 0), (F, 0), (F, 1), (F, 1),
        (F, 0), (B, 1), (F, 0), (B, 1), (F, 1), (B, 0), (F, 1), (B, 0),
        (B, 1), (B, 1), (B, 0), (B, 0))
    assert schedule_order(1, pp=2, vpp=2, num_microbatches=4) == (
        (F, 0), (F, 0),
        (F, 1), (B, 1), (F, 1), (B, 1), (F, 0), (B, 0), (F, 0), (B, 0), (F, 1), (B, 1),
        (F, 1), (B, 1), (B, 0), (B, 0))


def test_pp2_vpp2_in_flight_counted_by_hand():
    """Counting the order above: rank 0 before its backwards holds (chunk 0, chunk 1) =
    (3, 2), (4, 1), (4, 1), (3, 2), then in the cool-down (2, 2), (2, 1), (2, 0), (1, 0); 5 =
    warm-up + 1 at most, but 4 of them chunk 0's. Rank 1: (2, 1) at chunk 1's backwards,
    (3, 0) and then (2, 0), (1, 0) at chunk 0's: its last chunk (the head and the loss) is
    never held for more than one micro-batch."""
    assert set(in_flight_moments(0, pp=2, vpp=2, num_microbatches=4)) == {
        ((3, 2), 1), ((4, 1), 1), ((4, 1), 0), ((3, 2), 0), ((2, 2), 1), ((2, 1), 1),
        ((2, 0), 0), ((1, 0), 0)}
    assert set(in_flight_moments(1, pp=2, vpp=2, num_microbatches=4)) == {
        ((2, 1), 1), ((3, 0), 0), ((2, 0), 0), ((1, 0), 0)}
    assert in_flight_chunks(0, pp=2, vpp=2, num_microbatches=4) == 5


def test_pp4_vpp2_first_rank_holds_eight_of_its_first_chunk():
    """pp 4, vpp 2, 8 micro-batches, rank 0: warm-up 2 * 3 + 1 * 4 = 10 forwards (chunk 0 of
    mb 0-3, chunk 1 of mb 0-3, chunk 0 of mb 4, 5: counts (6, 4)). Steady: F c0 -> (7, 4) at
    B c1; F c0 -> (8, 3) at B c1; F c1 -> (8, 3) at B c1, twice; F c1 -> (8, 3) at B c0;
    F c1 -> (7, 4) at B c0. Cool-down: B c0 at (6, 4), (5, 4); B c1 at (4, 4), (4, 3), (4, 2),
    (4, 1); B c0 at (4, 0), (3, 0), (2, 0), (1, 0). The peak mix is 8 micro-batches of chunk 0
    (with the embedding) and 3 of chunk 1, not 11 of an average chunk."""
    moments = in_flight_moments(0, pp=4, vpp=2, num_microbatches=8)
    assert set(moments) == {
        ((7, 4), 1), ((8, 3), 1), ((8, 3), 0), ((7, 4), 0), ((6, 4), 0), ((5, 4), 0),
        ((4, 4), 1), ((4, 3), 1), ((4, 2), 1), ((4, 1), 1), ((4, 0), 0), ((3, 0), 0),
        ((2, 0), 0), ((1, 0), 0)}
    assert warmup_forwards(0, pp=4, vpp=2, num_microbatches=8) == 10


def test_one_chunk_is_plain_1f1b():
    """vpp 1: rank r runs pp - r - 1 warm-up forwards and holds pp - r micro-batches
    (Narayanan et al. 2021), all of them where there are fewer."""
    assert schedule_order(1, pp=3, vpp=1, num_microbatches=3) == (
        (F, 0), (F, 0), (B, 0), (F, 0), (B, 0), (B, 0))
    assert set(in_flight_moments(1, pp=3, vpp=1, num_microbatches=3)) == {
        ((2,), 0), ((1,), 0)}
    assert in_flight_chunks(0, pp=8, vpp=1, num_microbatches=3) == 3


def _megatron_schedule(rank: int, pp: int, vpp: int, m: int):
    """(warm-up forwards, forward chunk ids, backward chunk ids) from megatron-core's own
    ``get_pp_rank_microbatches`` and ``get_schedule_table`` (``get_model_chunk_id``: the
    backward's is ``vpp - 1 -`` the table's), group size pp as its config defaults."""
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    group = types.SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    p2p = types.SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)
    _, _, warmup, _ = schedules.get_pp_rank_microbatches(m, vpp, pp, p2p_communicator=p2p)
    chunks = [chunk for _, chunk in schedules.get_schedule_table(m, vpp, pp)]
    return warmup, chunks, [vpp - 1 - chunk for chunk in chunks]


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (4, 2, 16), (8, 4, 8)])
def test_order_matches_megatron_cores_schedule_tables(pp, vpp, m):
    """Every rank's warm-up and the chunk of each forward and backward, in order, as
    megatron-core's functions give them."""
    for rank in range(pp):
        warmup, forwards, backwards = _megatron_schedule(rank, pp, vpp, m)
        order = schedule_order(rank, pp=pp, vpp=vpp, num_microbatches=m)
        assert warmup_forwards(rank, pp=pp, vpp=vpp, num_microbatches=m) == warmup
        assert [chunk for forward, chunk in order if forward] == forwards
        assert [chunk for forward, chunk in order if not forward] == backwards
        assert all(forward for forward, _ in order[:warmup])


CHUNKS = (  # one layer per chunk: its largest transient is its last layer's
    (LayerTensors((30 * MIB,), (20 * MIB,)),),  # an embedding-heavy first chunk
    (LayerTensors((12 * MIB,), (40 * MIB,)),),  # a lighter last chunk, a large loss transient
)


@pytest.mark.parametrize("rank,pp,m", [(0, 2, 4), (1, 2, 4), (0, 4, 8), (2, 4, 8), (0, 4, 4)])
def test_the_closed_form_finds_the_replays_allocated_peak(rank, pp, m):
    """The allocated high-water of the allocator replaying the rank's order (every tensor a
    multiple of 2 MiB, so each block is split exactly and allocated = requested) equals the
    search's closed form: the largest, over the backwards' moments, of the chunks' kept bytes
    times their micro-batches in flight plus the backward chunk's transient. Worked by hand for
    pp 4, rank 0, m 8 (moments listed above): the mix (8, 3) at a backward of chunk 1 gives
    8 * 30 + 3 * 12 + 40 = 316 MiB, at one of chunk 0 296, (7, 4) at chunk 1 298: 316; the
    average chunk (21 MiB kept) times 11 in flight plus the larger transient would say 271."""
    order = schedule_order(rank, pp=pp, vpp=2, num_microbatches=m)
    replay = replay_schedule(CHUNKS, order=order)
    kept = [sum(layer.kept) for (layer,) in CHUNKS]
    working = [sum(layer.working) for (layer,) in CHUNKS]
    closed = max(sum(n * k for n, k in zip(counts, kept)) + working[chunk]
                 for counts, chunk in in_flight_moments(rank, pp=pp, vpp=2, num_microbatches=m))
    assert replay.backward_allocated == closed
    if (rank, pp, m) == (0, 4, 8):
        assert closed == 316 * MIB


def _moments_by_walking(rank: int, *, pp: int, vpp: int, num_microbatches: int) -> tuple:
    """The moments of ``schedule_order`` counted step by step: each forward adds a
    chunk-micro-batch to its chunk, each backward records what is in flight (its own
    included) and frees one; distinct moments in the order first met."""
    held, moments = [0] * vpp, {}
    for forward, chunk in schedule_order(rank, pp=pp, vpp=vpp, num_microbatches=num_microbatches):
        if forward:
            held[chunk] += 1
            continue
        moments.setdefault((tuple(held), chunk), None)
        held[chunk] -= 1
    return tuple(moments)


@pytest.mark.parametrize("pp,vpp,num_microbatches", [
    (2, 1, 4), (4, 1, 3), (2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 4, 6), (8, 2, 16), (4, 2, 12),
    (6, 3, 18), (8, 4, 24), (4, 5, 4), (5, 2, 15)])
def test_closed_form_moments_are_the_walked_schedules_in_order(pp, vpp, num_microbatches):
    """The closed form gives, for every rank, the very moments (and their order, which decides
    which of equal peaks is reported) that walking the schedule's order finds."""
    for rank in range(pp):
        assert in_flight_moments(rank, pp=pp, vpp=vpp, num_microbatches=num_microbatches) == \
            _moments_by_walking(rank, pp=pp, vpp=vpp, num_microbatches=num_microbatches)
