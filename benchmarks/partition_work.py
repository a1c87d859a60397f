"""What the stage-split model costs a large search: per-rank cost evaluations
(``costmodels.ranks.rank_cost``, the load-independent measure) and CPU seconds of
``autoplan.solve`` for GPT-3 175B on 1,024 A100 (seq 2048, batch 1536), with a time limit long
enough that no run meets it on a loaded machine.

    .venv/bin/python benchmarks/partition_work.py
    cd OTHER_CHECKOUT && PYTHONPATH=$PWD /path/to/.venv/bin/python benchmarks/partition_work.py

Run both lines back to back to compare two checkouts: CPU seconds depend on the machine's load.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import autoplan
import autoplan.costmodels.step as step

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLUSTER = {"gpu": "a100-sxm4-80gb", "nodes": 128, "gpus_per_node": 8,
           "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
           "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps"}}


def counted(function, calls: list[int]):
    def counting(*args, **kwargs):
        calls[0] += 1
        return function(*args, **kwargs)
    return counting


def main() -> None:
    calls = [0]
    step.rank_cost = counted(step.rank_cost, calls)
    model = autoplan.load_model(EXAMPLES / "models" / "gpt3_175b.py")
    model.trace(2048)
    cpu, wall = time.process_time(), time.perf_counter()
    result = autoplan.solve(model, CLUSTER, seq_len=2048, global_batch=1536, time_limit_s=3600)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    p = result.plan
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{Path(autoplan.__file__).parents[1]}: {calls[0]} rank_cost calls, {cpu:.2f} s CPU, "
          f"{wall:.2f} s wall, peak RSS {rss:.0f} MiB; TP{p.tp} PP{p.pp} DP{p.dp} vpp{p.vpp} "
          f"{result.estimate.step_time_s:.3f} s {result.status}")


if __name__ == "__main__":
    main()
