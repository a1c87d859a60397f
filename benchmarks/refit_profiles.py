"""Refit the [Empirical] A100 and DeepSpeed ZeRO-3 constants of costmodels/profiles.yaml over
every row of data/published_runs.csv at once, as documented there.

Procedure: a grid over the three A100 compute efficiencies (GEMM, batched attention GEMMs,
memory-bound kernels) and, for each point, over DeepSpeed's two ZeRO-3 constants (collective
bandwidth efficiency, overlap), which only the ZeRO-3 rows depend on. The score is the mean
absolute percentage error over all rows (what benchmarks/accuracy.py prints), ties broken by
the worst row. Five physical parameters in all, one value per GPU or runtime, no per-row
constant. Prints the best points; copying them into profiles.yaml is a deliberate step.

    .venv/bin/python benchmarks/refit_profiles.py
"""

from __future__ import annotations

import dataclasses
import sys
from itertools import product
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoplan.api import _plan_for, _training, load_cluster, load_model, make_problem  # noqa: E402
from autoplan.costmodels.step import estimate  # noqa: E402
from published_runs import published_runs  # noqa: E402

GEMM = (0.70, 0.72, 0.74, 0.76, 0.78)
BMM = (0.35, 0.45, 0.55)
MEMORY = (0.6, 0.7, 0.8)
ZERO3_EFFICIENCY = tuple(x / 100 for x in range(6, 31, 2))
ZERO3_OVERLAP = tuple(x / 10 for x in range(0, 11))


def _questions():
    """(run, problem, plan) per row, traced once."""
    out = []
    for run in published_runs():
        model, cluster = load_model(run.model), load_cluster(run.cluster)
        training = _training(run.seq_len, run.global_batch, run.precision, run.runtime, "explicit")
        problem = make_problem(model, cluster, training, runtime_settings=run.runtime_settings)
        out.append((run, problem, _plan_for(problem, cluster, model, run.pins)))
    return out


def _errors(questions, compute: dict, runtime: dict) -> list[float]:
    errors = []
    for run, problem, plan in questions:
        p = dataclasses.replace(problem, compute=dataclasses.replace(problem.compute, **compute),
                                runtime=dataclasses.replace(problem.runtime, **runtime), _cache={})
        errors.append(abs(estimate(p, plan).step_time_s / run.step_time_s - 1))
    return errors


def main() -> None:
    questions = _questions()
    zero3 = [q for q in questions if q[0].runtime == "deepspeed"]
    others = [q for q in questions if q[0].runtime != "deepspeed"]
    results = []
    for gemm, bmm, memory in product(GEMM, BMM, MEMORY):
        compute = {"gemm_efficiency": gemm, "bmm_efficiency": bmm, "memory_efficiency": memory}
        base = _errors(others, compute, {})
        best = min((sum(e), max(e), eff, ov)
                   for eff, ov in product(ZERO3_EFFICIENCY, ZERO3_OVERLAP)
                   for e in [_errors(zero3, compute, {"zero3_collective_efficiency": eff,
                                                       "zero3_overlap": ov})])
        mape = (sum(base) + best[0]) / len(questions)
        worst = max(max(base), best[1])
        results.append((round(mape, 4), worst, gemm, bmm, memory, best[2], best[3]))
    results.sort()
    print("MAPE    worst   gemm  bmm   mem   zero3_eff zero3_overlap")
    for mape, worst, *point in results[:10]:
        print(f"{mape:.2%}  {worst:.2%}  " + "  ".join(f"{v:.2f}" for v in point))


if __name__ == "__main__":
    main()
