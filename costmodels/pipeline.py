"""Pipeline schedules: step time from the per-micro-batch times of the pipeline ranks.

1F1B (PipeDream-Flush): with per-micro-batch times t_r of the p ranks, the step takes
``(m - 1) * max t + sum t`` (equal stages: (m + p - 1) t, bubble fraction (p - 1)/m).
Interleaved with v chunks per rank: the fill and drain shrink v-fold,
``m * max t + (sum t - max t) / v`` (bubble (p - 1)/(v m), Narayanan et al. 2021 sec. 2.2.2).
"""

from __future__ import annotations


def pipeline_time(*, slowest_s: float, total_s: float, num_microbatches: int, vpp: int) -> float:
    """Seconds from the first forward to the last backward of a step, given the slowest rank's
    micro-batch time and the sum of all ranks' micro-batch times."""
    return num_microbatches * slowest_s + (total_s - slowest_s) / vpp
