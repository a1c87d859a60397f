"""Wall time of infeasibility answers on a large cluster (issue 14 item 8): Llama 3 405B on
8,192 H100 (1,024 DGX H100) at 8,192 tokens with pins that do not fit. Tracing is timed apart.

    .venv/bin/python benchmarks/infeasible_speed.py
"""

from __future__ import annotations

import time
from pathlib import Path

import autoplan
from autoplan.errors import AutoplanError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLUSTER = {"preset": "dgx-h100", "nodes": 1024}
CASES = {
    "tp8 pp16 dp64, no recompute": {"tp": 8, "pp": 16, "dp": 64, "recompute": "none"},
    "tp1 pp1, no recompute": {"tp": 1, "pp": 1, "recompute": "none"},
}


def main() -> None:
    model = autoplan.load_model(EXAMPLES / "models" / "llama3_405b.py")
    start = time.perf_counter()
    model.trace(8192)
    print(f"trace: {time.perf_counter() - start:.1f} s")
    for name, pins in CASES.items():
        start = time.perf_counter()
        try:
            autoplan.solve(model, CLUSTER, seq_len=8192, global_batch=2048, pins=pins)
            outcome = "solved"
        except AutoplanError as err:
            outcome = f"exit {err.exit_code}: {str(err)[:160]}..."
        print(f"{name}: {time.perf_counter() - start:.1f} s, {outcome}")


if __name__ == "__main__":
    main()
