"""Pipeline schedules: step time from the per-micro-batch times of the pipeline ranks.

1F1B (PipeDream-Flush): with per-micro-batch times t_r of the p ranks, the step takes
``(m - 1) * max t + sum t`` (equal stages: (m + p - 1) t, bubble fraction (p - 1)/m).
Interleaved with v chunks per rank: the fill and drain shrink v-fold,
``m * max t + (sum t - max t) / v`` (bubble (p - 1)/(v m), Narayanan et al. 2021 sec. 2.2.2).
"""

from __future__ import annotations


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
