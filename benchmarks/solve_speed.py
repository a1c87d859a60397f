"""Wall time to a proven optimum, tracing included and excluded, and the same space enumerated
with estimate() alone (the brute-force reference) for comparison.

    .venv/bin/python benchmarks/solve_speed.py

The heterogeneous case (stages on 64 A100 and 64 V100) has far too many candidates to
enumerate (every block split of every stage-to-group assignment); its enumeration time is
projected from the time estimate() takes on a sample of them, and marked with a ~.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import autoplan
from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.costmodels.step import estimate
from autoplan.search.brute import brute_force
from autoplan.search.groups_space import (assignments, capacity, group_candidates, group_shapes,
                                          shape_switches)
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
    """The homogeneous cases, then the heterogeneous one."""
    print(f"{'case':30} {'trace s':>8} {'solve s':>8} {'total s':>8} {'enumerate s':>12} {'ratio':>6}  plan")
    for name, model_file, cluster, seq, batch in CASES:
        start = time.perf_counter()
        model = autoplan.load_model(EXAMPLES / "models" / model_file)
        model.trace(seq)
        traced = time.perf_counter()
        result = autoplan.solve(model, cluster, seq_len=seq, global_batch=batch)
        solved = time.perf_counter()
        problem = make_problem(model, load_cluster(cluster), training_spec(seq, batch, "bf16", "megatron", "flash"))
        brute_force(problem, Pins(), every_split=False)  # all splits: too many to list
        enumerated = time.perf_counter() - solved
        p = result.plan
        print(f"{name:30} {traced - start:8.2f} {solved - traced:8.2f} {solved - start:8.2f} "
              f"{enumerated:12.2f} {enumerated / (solved - traced):6.2f}  "
              f"TP{p.tp} PP{p.pp} DP{p.dp} CP{p.cp} mbs{p.micro_batch_size} vpp{p.vpp} "
              f"{p.recompute.value} ZeRO-{p.zero_stage} {result.status} {result.estimate.step_time_s:.2f}s")
    hetero("GPT 13B on 64 A100 + 64 V100", "gpt_13b.py", "a100-v100-x128-mixed.yaml", 2048, 512)


def candidates_on_groups(problem) -> int:
    """How many plans ``groups_space`` holds for the problem."""
    blocks, total = len(problem.graph.block_indices()), 0
    for shape in group_shapes(problem.graph, problem.cluster, problem.training, Pins()):
        caps = capacity(problem.cluster, problem.graph, shape.tp, shape.dp, Pins())
        splits = math.comb(blocks - 1, shape.pp - 1)
        total += (sum(1 for _ in assignments(caps, shape.pp)) * splits
                  * len(shape_switches(shape, problem.training, Pins())))
    return total


def projected_enumeration(problem, sample: int = 3000) -> float:
    """Seconds estimate() would take over every candidate, from its time on the first
    ``sample`` of them."""
    start = time.perf_counter()
    for _, plan in zip(range(sample), group_candidates(problem.graph, problem.cluster,
                                                       problem.training, Pins())):
        estimate(problem, plan)
    return (time.perf_counter() - start) / sample * candidates_on_groups(problem)


def hetero(name: str, model_file: str, cluster_file: str, seq: int, batch: int) -> None:
    start = time.perf_counter()
    model = autoplan.load_model(EXAMPLES / "models" / model_file)
    model.trace(seq)
    traced = time.perf_counter()
    cluster = EXAMPLES / "clusters" / cluster_file
    result = autoplan.solve(model, cluster, seq_len=seq, global_batch=batch)
    solved = time.perf_counter()
    problem = make_problem(model, load_cluster(cluster), training_spec(seq, batch, "bf16", "megatron", "flash"))
    enumerated = projected_enumeration(problem)
    p = result.plan
    print(f"{name:30} {traced - start:8.2f} {solved - traced:8.2f} {solved - start:8.2f} "
          f"{'~' + format(enumerated, '.3g'):>12} {enumerated / (solved - traced):6.0f}  "
          f"TP{p.tp} PP{p.pp} DP{p.dp} mbs{p.micro_batch_size} {p.recompute.value} "
          f"ZeRO-{p.zero_stage} {result.status} {result.estimate.step_time_s:.2f}s "
          f"stages {' '.join(p.stage_groups)}")


if __name__ == "__main__":
    main()
