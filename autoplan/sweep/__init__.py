"""Trade-off exploration (``autoplan sweep``): a grid of inputs solved in parallel through the
public API, Pareto fronts marked, tables and figures written.

- ``grid``: the points (inputs, axes, sweep YAML), solving them in worker processes or on Ray,
  the metrics, the document, its CSV/JSON and the terminal table;
- ``fronts``: the fronts and the Pareto mask;
- ``run``: ``sweep``, ``sweep_file``, ``write_sweep``, ``check_sweep_out``.
"""

from autoplan.sweep.fronts import FRONTS, pareto_mask
from autoplan.sweep.grid import (
    DEFAULT_PRICE_PER_GPU_HOUR, DEFAULT_TRAIN_TOKENS, PIN_NAMES, SWEEPABLE, Axes, PointInputs,
    SweepSpec, document, flat_rows, gpu_hour_price, load_sweep_spec, mark_fronts, metrics,
    parse_over, point_cluster, points, render, run_points, write_csv, write_json,
)
from autoplan.sweep.run import check_sweep_out, sweep, sweep_file, write_sweep

__all__ = [
    "DEFAULT_PRICE_PER_GPU_HOUR", "DEFAULT_TRAIN_TOKENS", "FRONTS", "PIN_NAMES", "SWEEPABLE",
    "Axes", "PointInputs", "SweepSpec", "check_sweep_out", "document", "flat_rows",
    "gpu_hour_price", "load_sweep_spec", "mark_fronts", "metrics", "pareto_mask", "parse_over",
    "point_cluster", "points", "render", "run_points", "sweep", "sweep_file", "write_csv",
    "write_json", "write_sweep",
]
