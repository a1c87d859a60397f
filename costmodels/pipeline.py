"""Pipeline schedules: step time from per-rank micro-batch times.

1F1B (PipeDream-Flush): with per-micro-batch times t_r of the p ranks, the step takes
``(m - 1) * max t + sum t`` (equal stages: (m + p - 1) t, bubble fraction (p - 1)/m).
Interleaved with v chunks per rank: the fill and drain shrink v-fold,
``m * max t + (sum t - max t) / v`` (bubble (p - 1)/(v m), Narayanan et al. 2021 eq. in 2.2.2).
"""

from __future__ import annotations


def pipeline_time(rank_times: list[float], *, num_microbatches: int, vpp: int) -> float:
    """Seconds from the first forward to the last backward of a step."""
    slowest = max(rank_times)
    return num_microbatches * slowest + (sum(rank_times) - slowest) / vpp


def bubble_time(rank_times: list[float], *, num_microbatches: int, vpp: int) -> float:
    """Idle time of the slowest rank: the schedule's fill and drain."""
    return pipeline_time(rank_times, num_microbatches=num_microbatches, vpp=vpp) - (
        num_microbatches * max(rank_times))
