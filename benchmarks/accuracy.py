"""Predicted vs published step time for every row of data/published_runs.csv.

Each run is estimated with the plan its authors used, on the hardware they used, with the
software of the time: Megatron-LM without FlashAttention (explicit attention scores) and
DeepSpeed for the ZeRO-3 rows, with what the row says of its framework's settings (see
published_runs.py). Prints a table and the mean absolute percentage error.

    .venv/bin/python benchmarks/accuracy.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import autoplan  # noqa: E402
from published_runs import published_runs  # noqa: E402


def predict(run) -> autoplan.Result:
    return autoplan.estimate(run.model, run.cluster, run.pins, seq_len=run.seq_len,
                             global_batch=run.global_batch, runtime=run.runtime,
                             precision=run.precision, attention="explicit",
                             runtime_settings=run.runtime_settings)


def main() -> None:
    errors = []
    print(f"{'row':16} {'tp':>3} {'pp':>3} {'dp':>5} {'mbs':>3} {'vpp':>3} {'rc':>9} "
          f"{'published s':>11} {'predicted s':>11} {'error':>7} {'mem GiB':>8}")
    for run in published_runs():
        result = predict(run)
        predicted = result.estimate.step_time_s
        error = (predicted - run.step_time_s) / run.step_time_s
        errors.append(abs(error))
        p = run.pins
        print(f"{run.row_id:16} {p['tp']:>3} {p['pp']:>3} {p['dp']:>5} {p['mbs']:>3} {p['vpp']:>3} "
              f"{p['recompute']:>9} {run.step_time_s:>11.2f} {predicted:>11.2f} {error:>+7.1%} "
              f"{result.estimate.peak_memory_gib:>8.1f}")
    print(f"\nrows: {len(errors)}  MAPE: {sum(errors) / len(errors):.1%}  "
          f"worst: {max(errors):.1%}  rows beyond 10%: {sum(e > 0.10 for e in errors)}")


if __name__ == "__main__":
    main()
