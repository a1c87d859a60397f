"""Wall time to a proven optimum, tracing included and excluded, and the same space enumerated
with estimate() alone (the brute-force reference) for comparison.

    .venv/bin/python benchmarks/solve_speed.py
"""

from __future__ import annotations

import time
from pathlib import Path

import autoplan
from autoplan.api import _training, load_cluster, make_problem
from autoplan.search.brute import brute_force
from autoplan.search.solver import solve_table
from autoplan.training import Pins

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def dgx(gpu: str, nodes: int, nic: str, nvlink: str) -> dict:
    return {"gpu": gpu, "nodes": nodes, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": nvlink},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": nic}}


CASES = [
    ("GPT-3 175B on 1024 A100", "gpt3_175b.py", dgx("a100-sxm4-80gb", 128, "200Gbps", "300GB/s"), 2048, 1536),
    ("MT-NLG 530B on 5128 A100", "mtnlg_530b.py", dgx("a100-sxm4-80gb", 641, "200Gbps", "300GB/s"), 2048, 1920),
    ("GPT 1T on 3072 A100", "gpt_1t.py", dgx("a100-sxm4-80gb", 384, "200Gbps", "300GB/s"), 2048, 3072),
    ("Llama-3 405B on 16384 H100", "llama3_405b.py", dgx("h100-sxm5-80gb", 2048, "400Gbps", "450GB/s"), 8192, 2048),
]


def main() -> None:
    print(f"{'case':30} {'trace s':>8} {'solve s':>8} {'total s':>8} {'enumerate s':>12} {'ratio':>6}  plan")
    for name, model_file, cluster, seq, batch in CASES:
        start = time.perf_counter()
        model = autoplan.load_model(EXAMPLES / "models" / model_file)
        model.trace(seq)
        traced = time.perf_counter()
        result = autoplan.solve(model, cluster, seq_len=seq, global_batch=batch)
        solved = time.perf_counter()
        problem = make_problem(model, load_cluster(cluster), _training(seq, batch, "bf16", "megatron", "flash"))
        brute_force(problem, Pins())
        enumerated = time.perf_counter() - solved
        p = result.plan
        print(f"{name:30} {traced - start:8.2f} {solved - traced:8.2f} {solved - start:8.2f} "
              f"{enumerated:12.2f} {enumerated / (solved - traced):6.2f}  "
              f"TP{p.tp} PP{p.pp} DP{p.dp} CP{p.cp} mbs{p.micro_batch_size} vpp{p.vpp} "
              f"{p.recompute.value} ZeRO-{p.zero_stage} {result.status} {result.estimate.step_time_s:.2f}s")
    print("heterogeneous 64 A100 + 64 V100: not supported yet (the solver plans one GPU type)")


if __name__ == "__main__":
    main()
