"""Refit the global [Empirical] constants of costmodels/profiles.yaml (those named in
costmodels.profiles.FITTED) over every estimated run of data/published_runs.csv and
data/more_runs.csv at once, by the coordinate descent benchmarks/accuracy.py uses leaving one
source out (benchmarks/fit.py). One value per constant, no per-row or per-source constant.
Prints the refitted values and the error before and after; copying them into profiles.yaml is
a deliberate step.

    .venv/bin/python benchmarks/refit_profiles.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit import fit, pose, predict_all  # noqa: E402
from more_runs import more_runs  # noqa: E402
from published_runs import published_runs  # noqa: E402


def _mae(errors: list[float]) -> float:
    return sum(map(abs, errors)) / len(errors)


def main() -> None:
    questions, _ = pose(published_runs() + more_runs()[0])
    values = fit(questions)
    print(f"rows: {len(questions)}  MAE as profiles.yaml stands: {_mae(predict_all(questions, {})):.2%}"
          f"  refitted: {_mae(predict_all(questions, values)):.2%}")
    for key, value in sorted(values.items()):
        kind = "scale of every GPU's value" if key.startswith("compute.") else "value"
        print(f"  {key:40} {value:.2f}  ({kind})")


if __name__ == "__main__":
    main()
