"""Pipeline schedules: step time from the per-micro-batch times of the pipeline ranks.

1F1B (PipeDream-Flush): with per-micro-batch times t_r of the p ranks, the step takes
``(m - 1) * max t + sum t`` (equal stages: (m + p - 1) t, bubble fraction (p - 1)/m).
Interleaved with v chunks per rank: the fill and drain shrink v-fold,
``m * max t + (sum t - max t) / v`` (bubble (p - 1)/(v m), Narayanan et al. 2021 sec. 2.2.2).

The order a rank runs its chunks' forwards and backwards in (``schedule_order``) and the
chunk-micro-batches it holds as each backward starts (``in_flight_moments``), which set its
activation memory (costmodels/ranks.py).
"""

from __future__ import annotations

from functools import lru_cache
from operator import sub


def pipeline_time(*, slowest_s: float, total_s: float, num_microbatches: int, vpp: int,
                  deferred_share: float = 0.0) -> float:
    """Seconds from the first forward to the last backward of a step, given the slowest rank's
    micro-batch time and the sum of all ranks' micro-batch times.

    ``deferred_share``: with a zero-bubble schedule, the share of a micro-batch's time that is
    weight-gradient work (W) the schedule defers into the bubble. Qi et al. 2023 (arXiv
    2401.10241, ZB-H1 at 1F1B memory): the fill and drain shrink from (p-1)(F+B+W) to
    (p-1)(F+B-W), a third of 1F1B's when F = B = W.
    """
    fill_and_drain = (total_s - slowest_s) / vpp
    return num_microbatches * slowest_s + fill_and_drain * max(0.0, 1.0 - 2.0 * deferred_share)


def blocking_transfers(*, has_prev: bool, has_next: bool, batched: bool) -> int:
    """Point-to-point transfers on a pipeline rank's stream per micro-batch, each waiting for
    its peer before the rank's next kernel.

    ``batched`` (Megatron-LM): each exchange of the 1F1B steady state is one batched
    isend/irecv pair (send_forward_recv_backward and its mirror), two per micro-batch on every
    rank. Unbatched (DeepSpeed's PipelineEngine): TrainSchedule's instruction stream puts
    RecvActivation and SendGrad in the forward step and RecvGrad and SendActivation in the
    backward step (deepspeed/runtime/pipe/schedule.py), each a blocking ``p2p.send`` or
    ``p2p.recv`` (runtime/pipe/p2p.py): four per micro-batch on a middle stage, the first
    stage has no RecvActivation/SendGrad and the last no SendActivation/RecvGrad.
    """
    if batched:
        return 2
    return 2 * int(has_prev) + 2 * int(has_next)


def partition_gathers(*, has_prev: bool, has_next: bool) -> int:
    """All-gathers over the TP group per micro-batch that rebuild DeepSpeed's partitioned
    pipeline tensors (pipeline config ``pipe_partitioned`` and ``grad_partitioned``, on by
    default with TP > 1: each TP rank sends 1/tp of the boundary tensor, PartitionedTensor):
    the received activation before the forward (_exec_forward_pass: ``part_input.full()``), and
    in the backward the stage's own output, freed after its send, and the received gradient
    (_exec_backward_pass: ``part_output.full()``, ``part_grad.full()``)."""
    return int(has_prev) + 2 * int(has_next)


def partition_meta_bytes(tp: int) -> int:
    """Bytes of the LongTensor that PartitionedTensor.to_meta() sends ahead of each partitioned
    pipeline tensor (deepspeed/runtime/utils.py): its number of dimensions, the three sizes of
    a [s, b, h] activation and the tp + 1 partition offsets, 8 bytes each."""
    return 8 * (1 + 3 + tp + 1)


def microbatches_per_round(pp: int, num_microbatches: int) -> int:
    """Micro-batches each chunk runs in a row before the rank turns to its next chunk in an
    interleaved schedule: megatron-core's ``microbatch_group_size_per_vp_stage`` (``pp`` by
    default, which Megatron-LM needs to divide the micro-batches) and torch's
    ``ScheduleInterleaved1F1B.microbatches_per_round`` (``m // max(1, m // pp)``, the same
    wherever ``pp`` divides ``m``); ``m`` itself where rounds do not divide it."""
    rounds = max(1, num_microbatches // pp)
    return num_microbatches // rounds if num_microbatches % rounds == 0 else num_microbatches


def warmup_forwards(rank: int, *, pp: int, vpp: int, num_microbatches: int) -> int:
    """Forwards a pipeline rank runs before its first backward: ``pp - rank - 1`` in 1F1B;
    interleaved, ``2 (pp - rank - 1) + (vpp - 1) g`` chunk-micro-batches (g the micro-batches
    per round), capped at all ``m vpp`` of them (megatron-core ``get_pp_rank_microbatches``,
    torch ``_get_warmup_ops``)."""
    total = num_microbatches * vpp
    if vpp == 1:
        return min(pp - rank - 1, total)
    group = microbatches_per_round(pp, num_microbatches)
    return min(2 * (pp - rank - 1) + (vpp - 1) * group, total)


def chunk_of(op: int, *, vpp: int, group: int, forward: bool) -> int:
    """The model chunk of a rank's ``op``-th forward (or backward): chunks take turns every
    ``group`` micro-batches, forwards from the first chunk, backwards from the last
    (megatron-core ``get_model_chunk_id`` over ``get_schedule_table``)."""
    chunk = (op // group) % vpp
    return chunk if forward else vpp - 1 - chunk


def schedule_order(rank: int, *, pp: int, vpp: int,
                   num_microbatches: int) -> tuple[tuple[bool, int], ...]:
    """``(is_forward, chunk)`` of each compute step of one pipeline rank, in the order it runs
    them (each chunk's micro-batches in order, its backwards oldest first): the warm-up
    forwards, then the steady state's forward followed by a backward, then the cool-down
    backwards (megatron-core ``forward_backward_pipelining_with_interleaving`` and
    ``..._without_interleaving``; torch's ``_get_1f1b_rank_ops``)."""
    total = num_microbatches * vpp
    warmup = warmup_forwards(rank, pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    group = microbatches_per_round(pp, num_microbatches)
    order = [(True, chunk_of(k, vpp=vpp, group=group, forward=True)) for k in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            order.append((True, chunk_of(warmup + k, vpp=vpp, group=group, forward=True)))
        order.append((False, chunk_of(k, vpp=vpp, group=group, forward=False)))
    return tuple(order)


def _forwards_per_chunk(done: int, *, vpp: int, group: int) -> list[int]:
    """Of a rank's first ``done`` forwards, those of each chunk (``group`` per round of ``vpp
    group`` forwards): after ``rounds`` whole rounds, the ``into`` forwards of the round under
    way have filled the first ``full`` chunks and put ``part`` into the next (``full < vpp``
    as ``into < vpp group``). Built by repetition, not a min/max per chunk: the search asks
    twice per backward of each schedule it prices."""
    rounds, into = divmod(done, vpp * group)
    full, part = divmod(into, group)
    base = rounds * group
    return [base + group] * full + [base + part] + [base] * (vpp - 1 - full)


@lru_cache(maxsize=4096)
def in_flight_moments(rank: int, *, pp: int, vpp: int,
                      num_microbatches: int) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The distinct moments a rank's backward starts, as (chunk-micro-batches in flight per
    chunk, the micro-batch's own included; the chunk whose backward it is). Closed form of
    :func:`schedule_order`: before backward k, ``min(w + k + 1, m vpp)`` forwards and k
    backwards have run, chunk c has had ``F_c`` of those forwards and of the backwards those
    of chunk ``vpp - 1 - c``'s turn (``F`` counts a chunk's turns, :func:`_forwards_per_chunk`).
    The steady state repeats every ``vpp g`` steps, so one turn of it and the cool-down give
    every moment. Memoized: the search asks for each rank of each shape."""
    total = num_microbatches * vpp
    warmup = warmup_forwards(rank, pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    group = microbatches_per_round(pp, num_microbatches)
    steady = range(min(total - warmup, vpp * group))
    steps = (*steady, *range(total - warmup, total))
    if vpp == 1:  # one chunk: min(w + k + 1, m) forwards and k backwards before backward k
        return tuple(dict.fromkeys(((min(warmup + k + 1, total) - k,), 0) for k in steps))
    moments = {}
    for k in steps:
        done = min(warmup + k + 1, total)
        backwards = _forwards_per_chunk(k, vpp=vpp, group=group)[::-1]
        counts = tuple(map(sub, _forwards_per_chunk(done, vpp=vpp, group=group), backwards))
        moments[(counts, chunk_of(k, vpp=vpp, group=group, forward=False))] = None
    return tuple(moments)
