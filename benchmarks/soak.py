"""Soak: many random solves in one process, printing resident memory as it goes; it must not
grow once the first traces are cached.

    .venv/bin/python benchmarks/soak.py [N]     (default 1000)
"""

from __future__ import annotations

import random
import resource
import sys
import time
from pathlib import Path

import autoplan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def random_case(rng: random.Random) -> tuple[dict, int, int, str]:
    nodes, gpus = rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8])
    cluster = {"gpu": rng.choice(["a100-sxm4-80gb", "h100-sxm5-80gb", "rtx-4090"]),
               "nodes": nodes, "gpus_per_node": gpus,
               "intra_node": {"link": rng.choice(["nvswitch", "pcie"]), "bandwidth": "32GB/s"}}
    if nodes > 1:
        cluster["inter_node"] = {"link": "ethernet", "bandwidth": f"{rng.choice([10, 100])}Gbps"}
    return cluster, rng.choice([64, 128, 256]), rng.choice([8, 16, 32]), rng.choice(["1GiB", "4GiB", "80GiB"])


def main(count: int) -> None:
    rng = random.Random(0)
    model = autoplan.load_model(EXAMPLES / "models" / "tiny_gpt.py")
    start, outcomes = time.perf_counter(), {"ok": 0, "infeasible": 0, "error": 0}
    for i in range(1, count + 1):
        cluster, seq, batch, mem = random_case(rng)
        try:
            autoplan.solve(model, cluster, seq_len=seq, global_batch=batch, mem_limit=mem)
            outcomes["ok"] += 1
        except autoplan.InfeasibleError:
            outcomes["infeasible"] += 1
        except autoplan.AutoplanError:
            outcomes["error"] += 1
        if i in (10, 100) or i % 250 == 0:
            print(f"{i:5d} solves  {time.perf_counter() - start:7.1f} s  RSS {rss_mib():7.1f} MiB  {outcomes}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
