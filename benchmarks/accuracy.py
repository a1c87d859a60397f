"""Predicted vs measured step time for every run of data/published_runs.csv and
data/more_runs.csv, in sample and leave-one-source-out.

Each run is estimated with the configuration its authors published, on the hardware they name,
with autoplan filling the rest (published_runs.py and more_runs.py say how each row is posed and
what is assumed). Rows that cannot be estimated are counted with the reason. Printed:
- every row (with --rows), then the mean absolute error per source and per (GPU, runtime);
- leave-one-source-out: the fitted constants (costmodels.profiles.FITTED) are refitted on every
  other source, by coordinate descent on the mean absolute error of the rows, and the held-out
  source is predicted with them. The constants are global, one value each (a relative change of
  every GPU's efficiency, or a runtime's behaviour): no per-row or per-source constant exists.

    .venv/bin/python benchmarks/accuracy.py [--rows] [--no-loso]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit import Question, fit, pose, predict_all  # noqa: E402
from more_runs import more_runs  # noqa: E402
from published_runs import published_runs  # noqa: E402


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _table(title: str, groups: dict[str, list[float]]) -> None:
    print(f"\n{title}")
    print(f"  {'':24} {'rows':>5} {'MAE':>7} {'bias':>7} {'worst':>7} {'>10%':>5}")
    for key in sorted(groups):
        errors = groups[key]
        print(f"  {key:24} {len(errors):>5} {_mean(map(abs, errors)):>7.1%} {_mean(errors):>+7.1%} "
              f"{max(map(abs, errors)):>7.1%} {sum(abs(e) > 0.10 for e in errors):>5}")


def _print_rows(questions: list[Question], errors: list[float], predicted: list[float]) -> None:
    print(f"{'row':16} {'gpu':15} {'runtime':9} {'tp':>3} {'pp':>3} {'dp':>4} {'mbs':>3} "
          f"{'rc':>5} {'z':>1} {'measured s':>10} {'predicted s':>11} {'error':>7}")
    for q, e, p in zip(questions, errors, predicted):
        pins = q.run.pins
        print(f"{q.run.row_id:16} {q.run.gpu:15} {q.run.runtime:9} {pins['tp']:>3} {pins['pp']:>3} "
              f"{pins['dp']:>4} {pins['mbs']:>3} {pins['recompute']:>5} {pins['zero']:>1} "
              f"{q.run.step_time_s:>10.2f} {p:>11.2f} {e:>+7.1%}")


def _leave_one_source_out(questions: list[Question]) -> None:
    sources = sorted({q.run.source for q in questions})
    print("\nleave-one-source-out (refit FITTED on the other sources, predict this one)")
    print(f"  {'held out':10} {'rows':>5} {'in-sample MAE':>13} {'held-out MAE':>12}  refitted")
    in_sample = predict_all(questions, {})
    held_all = []
    for source in sources:
        train = [q for q in questions if q.run.source != source]
        test = [q for q in questions if q.run.source == source]
        values = fit(train)
        held = predict_all(test, values)
        held_all += held
        mine = [e for q, e in zip(questions, in_sample) if q.run.source == source]
        shown = " ".join(f"{k}={v:.2f}" for k, v in sorted(values.items()))
        print(f"  {source:10} {len(test):>5} {_mean(map(abs, mine)):>13.1%} "
              f"{_mean(map(abs, held)):>12.1%}  {shown}")
    print(f"  {'all':10} {len(held_all):>5} {_mean(map(abs, in_sample)):>13.1%} "
          f"{_mean(map(abs, held_all)):>12.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="print every row")
    parser.add_argument("--no-loso", action="store_true", help="skip leave-one-source-out")
    args = parser.parse_args()
    extra, skipped = more_runs()
    questions, refused = pose(published_runs() + extra)
    errors = predict_all(questions, {})
    predicted = [q.run.step_time_s * (1 + e) for q, e in zip(questions, errors)]
    if args.rows:
        _print_rows(questions, errors, predicted)
    by_source, by_kind = defaultdict(list), defaultdict(list)
    for q, e in zip(questions, errors):
        by_source[q.run.source].append(e)
        by_kind[f"{q.run.gpu} {q.run.runtime}"].append(e)
    _table("per source (error = predicted / measured - 1)", by_source)
    _table("per (GPU, runtime)", by_kind)
    reasons = defaultdict(int)
    for s in skipped:
        reasons[(s.source, s.reason)] += 1
    print(f"\nnot estimated: {len(skipped) + len(refused)} rows")
    for (source, reason), count in sorted(reasons.items()):
        print(f"  {source:9} {count:>4}  {reason}")
    for run, message in refused:
        print(f"  {run.row_id:14} refused: {message}")
    print(f"\nestimated rows: {len(errors)}  MAE: {_mean(map(abs, errors)):.1%}  "
          f"worst: {max(map(abs, errors)):.1%}  rows beyond 10%: {sum(abs(e) > 0.10 for e in errors)}")
    if not args.no_loso:
        _leave_one_source_out(questions)


if __name__ == "__main__":
    main()
