"""Limits: inputs far past the usual sizes must solve within the time limit, or come back with
the best plan found and its gap (FEASIBLE), or be refused quickly with a clear message; never
hang.

    .venv/bin/python benchmarks/limits.py [--time-limit S]      (default 60)

Cases: a cluster of 100,000 GPUs (12,500 nodes x 8 H100) for Llama-2 70B; a GPT of 1,000
blocks (hidden 256) on 16 DGX A100; the topology drawing of the 100,000 GPUs; Llama-2 7B on a
heterogeneous cluster of 10 groups (five GPU kinds, 2-11 nodes each: pipeline stages on groups).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import autoplan
from autoplan.api import draw_topology

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
THOUSAND_BLOCKS = """from autoplan.zoo import GPT, GPTConfig


def build_model():
    return GPT(GPTConfig(num_layers=1000, hidden_size=256, num_heads=4, vocab_size=1024,
                         max_seq_len=256))
"""
GPUS = ["a100-sxm4-80gb", "a100-sxm4-40gb", "h100-sxm5-80gb", "v100-sxm2-32gb", "rtx-4090"]


def dgx(gpu: str, nodes: int) -> dict:
    return {"gpu": gpu, "nodes": nodes, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps"}}


def ten_groups() -> dict:
    groups = []
    for i in range(10):
        group = {k: v for k, v in dgx(GPUS[i % len(GPUS)], 2 + i).items()}
        group["name"] = f"g{i}"
        if GPUS[i % len(GPUS)] == "rtx-4090":
            group["intra_node"] = {"link": "pcie", "bandwidth": "32GB/s"}
        groups.append(group)
    return {"name": "ten-groups", "groups": groups}


def case(name: str, run) -> None:
    start = time.perf_counter()
    try:
        result = run()
    except autoplan.AutoplanError as err:
        print(f"{name:34} {time.perf_counter() - start:7.2f} s  exit {err.exit_code}: {err}")
        return
    p, s = result.plan, result.solver
    print(f"{name:34} {time.perf_counter() - start:7.2f} s  {s.status} gap {s.gap:.3f} "
          f"(solver {s.wall_time_s:.2f} s)  TP{p.tp} PP{p.pp} DP{p.dp} mbs{p.micro_batch_size} "
          f"vpp{p.vpp} ZeRO-{p.zero_stage} {p.recompute.value}  {p.world_size} GPUs  "
          f"{result.estimate.step_time_s:.3f} s/step")
    if p.stage_groups:
        print(f"{'':34} stages on groups {' '.join(p.stage_groups)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=60.0)
    limit = parser.parse_args().time_limit
    print(f"time limit {limit:g} s; times include tracing")
    case("100,000 GPUs (12,500 x 8), 70B", lambda: autoplan.solve(
        EXAMPLES / "models" / "llama2_70b.py", dgx("h100-sxm5-80gb", 12_500), seq_len=4096,
        global_batch=4096, time_limit_s=limit))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "gpt_1000_blocks.py")
        path.write_text(THOUSAND_BLOCKS)
        case("GPT of 1,000 blocks on 128 A100", lambda: autoplan.solve(
            path, dgx("a100-sxm4-80gb", 16), seq_len=256, global_batch=512, time_limit_s=limit))
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        cluster = autoplan.load_cluster(dgx("h100-sxm5-80gb", 12_500))
        draw_topology(cluster, Path(folder, "topo.png"))
        print(f"{'topo --png of 100,000 GPUs':34} {time.perf_counter() - start:7.2f} s")
    case("10 heterogeneous groups, Llama-2 7B", lambda: autoplan.solve(
        EXAMPLES / "models" / "llama2_7b.py", ten_groups(), seq_len=4096, global_batch=1024,
        time_limit_s=limit))


if __name__ == "__main__":
    main()
