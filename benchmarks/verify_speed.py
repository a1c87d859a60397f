"""Wall and CPU time of every ``autoplan verify`` case of the test suite (tests/verify/cases.py),
and how far each rank's measured peak memory is from the prediction.

The goal is a few seconds per case on a 2-core machine, so that all of them run in the default
test suite, and every rank's memory within about 15%. Prints one line per case: wall seconds,
CPU seconds of this process and its forked ranks together, the largest relative loss
difference, and the measured/predicted-1 of every rank. Wall time is noisy on a shared machine;
CPU time is the steadier figure.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan import api  # noqa: E402
from tests.verify.cases import CASES, MODELS, SEQ_LEN, STEPS, model_path, plan_of  # noqa: E402


def cpu_seconds() -> float:
    """User and system CPU of this process and of its children that have been waited for."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    api.load_model(model_path(MODELS[0])).trace(SEQ_LEN)  # torch's lazy imports, paid once
    for model in MODELS:
        for case in CASES:
            plan = plan_of(case)
            wall, cpu = time.perf_counter(), cpu_seconds()
            doc = api.verify(model_path(model), plan, steps=STEPS, seq_len=SEQ_LEN)
            wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
            errors = " ".join(f"{r['peak_bytes_measured'] / r['peak_bytes_predicted'] - 1:+.0%}"
                              for r in doc["ranks"])
            print(f"{model:15s} {case:22s} {plan.world_size} ranks  {STEPS} steps  "
                  f"wall {wall:5.1f} s  cpu {cpu:5.1f} s  "
                  f"max rel loss diff {doc['max_rel_loss_diff']:.1e}  memory {errors}", flush=True)


if __name__ == "__main__":
    main()
