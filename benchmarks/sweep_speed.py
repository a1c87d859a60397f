"""How long a 64-point sweep of Llama 2 70B takes on this machine (issue #9: under a minute).

Prints the wall time, the points per second and the per-point solver time; writes the table and
the figures to docs/sweeps/llama2_70b/ when --out is given. Not a test: it measures.

    .venv/bin/python benchmarks/sweep_speed.py [--workers N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from autoplan import api
from autoplan import sweep as sweeps
from autoplan.problems import make_problem, training_spec

SWEEP = Path(__file__).resolve().parents[1] / "examples" / "sweeps" / "llama2_70b_scaling.yaml"


def _split_one_point() -> None:
    """Where one point's time goes: tabulating the estimates vs the whole solve (CP-SAT)."""
    from autoplan.search.table import Table
    from autoplan.training import Pins

    spec = api.load_cluster(SWEEP.parent.parent / "clusters" / "dgx-a100-x16.yaml")
    model = api.load_model(SWEEP.parent.parent / "models" / "llama2_70b.py")
    training = training_spec(4096, 512, "bf16", "megatron", "flash")
    model.trace(4096)
    start = time.perf_counter()
    table = Table.build(make_problem(model, spec, training), Pins())
    tabulate = time.perf_counter() - start
    start = time.perf_counter()
    api.solve(model, spec, seq_len=4096, global_batch=512, runners_up=False)
    solve = time.perf_counter() - start
    start = time.perf_counter()
    api.solve(model, spec, seq_len=4096, global_batch=512)
    with_runners_up = time.perf_counter() - start
    print(f"one point (16 nodes, seq 4096, batch 512): {len(table)} candidates tabulated in "
          f"{tabulate:.2f} s; the whole solve as a sweep runs it {solve:.2f} s (so "
          f"{solve - tabulate:.2f} s in CP-SAT and the report), {with_runners_up:.2f} s with "
          "the exact runners-up of a single solve")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="processes (default: cores)")
    parser.add_argument("--out", type=Path, default=None, help="folder for table and figures")
    args = parser.parse_args()
    start = time.perf_counter()
    doc = sweeps.sweep_file(SWEEP, workers=args.workers)
    wall = time.perf_counter() - start
    points = doc["points"]
    solved = [p for p in points if p["plan"]]
    solver_s = sum(p["solver"]["wall_time_s"] for p in solved)
    print(f"{len(points)} points ({len(solved)} feasible) in {wall:.1f} s on "
          f"{args.workers or os.cpu_count()} workers ({os.cpu_count()} cores): "
          f"{len(points) / wall:.2f} points/s; solver time {solver_s:.1f} s in total, "
          f"{solver_s / max(1, len(solved)):.2f} s per feasible point")
    print("under a minute" if wall < 60 else "OVER a minute (issue #9 asks for under one)")
    _split_one_point()
    if args.out:
        for path in sweeps.write_sweep(doc, args.out):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
