"""Calibrate on three measured runs per model, judge on the rest (prints; not a test).

Data: the 52 llm-foundry H100 rows of shared/data/more_runs.csv (LLMF-H100-01..52, MPT 760M to
70B, PyTorch FSDP FULL_SHARD, 8-64 H100 GPUs), copied verbatim into
tests/data/calibration/llmf_h100/more_runs_llmf_h100.csv and converted to runs.csv there (row
k+1 of runs.csv is LLMF-H100-k). For each model the calibration takes its first, middle and
last row (by row id); every other row is held out. Printed: the fit (what was fitted, what was
fixed and why), per held-out row measured / before / after, and the mean |error| of
tokens/s/GPU before and after on the held-out rows, with the leave-one-run-out error of the
calibration set.

    .venv/bin/python benchmarks/calibration_runs.py [--no-loro]
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

from autoplan import api
from autoplan.fit import mean_abs_error, predict

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "calibration" / "llmf_h100"


def split(rows: list[dict]) -> tuple[list[int], list[int]]:
    """(calibration, held-out) indices: first, middle and last row of each model."""
    by_model: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_model.setdefault(row["model"], []).append(i)
    chosen = []
    for indices in by_model.values():
        picks = {indices[0], indices[len(indices) // 2], indices[-1]}
        chosen += sorted(picks)
    return sorted(chosen), [i for i in range(len(rows)) if i not in chosen]


def selection_loss(rows: list[dict], predicted: dict[int, tuple], column: int) -> str:
    """Mean and worst loss of measured tokens/s/GPU when, in each cell of two or more runs,
    the run predicted fastest is chosen instead of the measured fastest."""
    cells: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        cells.setdefault((row["model"], row["seq_len"]), []).append(i)
    losses = []
    for members in cells.values():
        if len(members) < 2:
            continue
        best = max(predicted[i][0] for i in members)
        chosen = max(members, key=lambda i: predicted[i][column])
        losses.append(1 - predicted[chosen][0] / best)
    return (f"mean loss {sum(losses) / len(losses):.1%}, worst {max(losses):.1%} over "
            f"{len(losses)} cells")


def write_subset(lines: list[str], indices: list[int], folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text("\n".join([lines[0], *(lines[i + 1] for i in indices)]) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-loro", action="store_true", help="skip the leave-one-run-out refits")
    args = parser.parse_args()
    lines = (DATA / "runs.csv").read_text().splitlines()
    rows = list(csv.DictReader(lines))
    calibration, held_out = split(rows)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for source in [*DATA.glob("*.py"), *DATA.glob("*.yaml")]:
            shutil.copy(source, folder)
        subset = write_subset(lines, calibration, Path(folder), "calibration.csv")
        profile = api.calibrate_runs([subset], Path(folder) / "profile.yaml", force=True,
                                     leave_one_out=not args.no_loro)
        rest = write_subset(lines, held_out, Path(folder), "held_out.csv")
        from autoplan.runs import read_runs
        judged = api.fit_runs(read_runs(rest))
    fit_s = time.perf_counter() - start
    print(f"calibration rows (LLMF-H100-): {', '.join(f'{i + 1:02d}' for i in calibration)}")
    print(f"fitted: {', '.join(f'{k} {profile.catalog[k]:.4g} -> {v:.4g}' for k, v in profile.parameters.items())}")
    for name, reason in profile.fixed.items():
        print(f"fixed {name}: {reason}")
    f = profile.fit
    print(f"calibration set ({len(calibration)} runs): mean |error| {f.mean_abs_error_before:.1%} "
          f"before, {f.mean_abs_error_after:.1%} after"
          + (f", leave-one-run-out {f.loro_mean_abs_error:.1%}" if f.loro_mean_abs_error else ""))
    measured, before, after = [], [], []
    print(f"{'row':>14} {'model':>12} {'seq':>6} {'GPUs':>5} {'measured':>9} {'before':>9} {'after':>9}")
    for index, run in zip(held_out, judged):
        b = predict(run, {}).tokens_per_s_per_gpu
        a = predict(run, profile.parameters).tokens_per_s_per_gpu
        measured.append(run.tokens_per_s_per_gpu)
        before.append(b)
        after.append(a)
        print(f"LLMF-H100-{index + 1:02d} {rows[index]['model'][:-3]:>12} {rows[index]['seq_len']:>6} "
              f"{run.plan.world_size:>5} {run.tokens_per_s_per_gpu:>9,.0f} {b:>9,.0f} {a:>9,.0f}")
    print(f"held-out ({len(held_out)} runs): tokens/s/GPU mean |error| "
          f"{mean_abs_error(before, measured):.1%} before calibration, "
          f"{mean_abs_error(after, measured):.1%} after")
    predicted = {i: (r.tokens_per_s_per_gpu[0], r.tokens_per_s_per_gpu[1], r.tokens_per_s_per_gpu[2])
                 for i, r in zip(calibration, profile.runs)}
    predicted.update({i: t for i, t in zip(held_out, zip(measured, before, after))})
    for label, column in (("before", 1), ("after", 2)):
        print(f"choosing the predicted-fastest run of each (model, seq_len) cell, {label}: "
              f"{selection_loss(rows, predicted, column)}")
    print("out-of-memory judgement: not measurable here (every LLMF-H100 row ran)")
    print(f"wall time {fit_s:.0f} s")


if __name__ == "__main__":
    main()
