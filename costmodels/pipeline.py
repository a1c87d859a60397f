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
