"""Running a sweep: the grid's points solved through the public API (this package is a client
of ``autoplan.api``), the document with its fronts, and its files."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoplan.api import (DEFAULT_TIME_LIMIT_S, DEFAULT_TRACE_TIME_LIMIT_S, ClusterLike,
                          ModelLike, ProfileLike, load_cluster, load_model, loaded_profile)
from autoplan.cluster.spec import require_homogeneous
from autoplan.errors import OutputExistsError
from autoplan.files import check_writable_folder, refuse_existing, write_errors_as
from autoplan.options import validated
from autoplan.sweep.grid import (DEFAULT_PRICE_PER_GPU_HOUR, DEFAULT_TRAIN_TOKENS, Axes,
                                 PointInputs, document, load_sweep_spec, points, run_points,
                                 write_csv, write_json)


def sweep(model: ModelLike, cluster: ClusterLike, *, over: Axes | Mapping[str, list],
          base: PointInputs | Mapping[str, Any] | None = None,
          time_limit_s: float | None = None, workers: int | None = None,
          price_per_gpu_hour: float | dict[str, float] | None = None,
          train_tokens: float | None = None, ray_address: str | None = None,
          progress: Callable[[int, int], None] | None = None,
          profile: ProfileLike = None) -> dict:
    """Solve every point of a grid of inputs and mark the Pareto fronts (see autoplan.sweep).

    Args:
        model: a path to model.py, an imported module, or a loaded :class:`Model`; traced once
            per sequence length and precision here, the traces shipped to the workers.
        cluster: the base cluster (path, mapping or loaded); points change nodes, gpu, links.
        over: the swept inputs, ``{"nodes": [1, 2, 4], "seq_len": [2048, 4096]}`` or ``Axes``.
        base: inputs held fixed (``{"seq_len": 4096, "global_batch": 512, "zero": 1}``).
        workers: processes (default: the machine's cores).
        price_per_gpu_hour: $ per GPU-hour, one price or ``{gpu name: price}``.
        train_tokens: tokens of the run whose time-to-train and cost the fronts use.
        ray_address: run the points as Ray tasks there (``local`` starts Ray here).
        progress: ``callback(done, total)`` after each point.
        profile: a calibration profile every point is solved with (as :func:`solve`).

    Returns:
        The ``sweep --json`` document: ``{"points": [{"inputs", "plan", "estimate", "solver",
        "metrics", "fronts", "pareto"}, ...]}``; an infeasible point has ``plan: None`` and
        ``error``.
    """
    start = time.perf_counter()
    model, cluster = load_model(model), load_cluster(cluster)
    require_homogeneous(cluster.cluster, "sweep")
    axes = over if isinstance(over, Axes) else validated(Axes, over, "over")
    base = base if isinstance(base, PointInputs) else validated(
        PointInputs, base or {}, "base")
    inputs = points(base, axes)
    rows = run_points(model, cluster, inputs,
                             time_limit_s=time_limit_s or DEFAULT_TIME_LIMIT_S, workers=workers,
                             ray_address=ray_address, progress=progress,
                             profile=loaded_profile(profile))
    return document(
        inputs, rows, model_name=model.name, wall_time_s=time.perf_counter() - start,
        price_per_gpu_hour=price_per_gpu_hour or DEFAULT_PRICE_PER_GPU_HOUR,
        train_tokens=train_tokens or DEFAULT_TRAIN_TOKENS)


def sweep_file(path: str | Path, *, workers: int | None = None, ray_address: str | None = None,
               progress: Callable[[int, int], None] | None = None, profile: ProfileLike = None,
               trace_time_limit_s: float | None = None) -> dict:
    """Run a sweep YAML (examples/sweeps/*.yaml); ``trace_time_limit_s`` as in :func:`load_model`."""
    spec = load_sweep_spec(path)
    model = load_model(spec.model,
                       trace_time_limit_s=trace_time_limit_s or DEFAULT_TRACE_TIME_LIMIT_S)
    return sweep(model, spec.cluster, over=spec.over, base=spec.base,
                 time_limit_s=spec.time_limit_s, workers=workers,
                 price_per_gpu_hour=spec.price_per_gpu_hour, train_tokens=spec.train_tokens,
                 ray_address=ray_address, progress=progress, profile=profile)


def write_sweep(doc: dict, folder: str | Path, *, force: bool = False) -> list[Path]:
    """sweep.csv, sweep.json and the sweep figures (PNG) into ``folder``, each written
    atomically.

    Raises:
        OutputExistsError: one of them exists and ``force`` is false (nothing is written).
    """
    from autoplan import plots
    folder = Path(folder)
    figures = any(p["plan"] for p in doc["points"])
    check_sweep_out(folder, force=force)
    with write_errors_as(OutputExistsError):
        folder.mkdir(parents=True, exist_ok=True)
        written = [write_csv(doc, folder / "sweep.csv"),
                   write_json(doc, folder / "sweep.json")]
        if figures:
            written += plots.sweep_figures(doc, folder)
    return written


def check_sweep_out(folder: str | Path, *, force: bool = False) -> None:
    """Refuse a ``folder`` that is a file or cannot be written, or (without ``force``) holds
    any file :func:`write_sweep` may write (called before the sweep runs, so a refusal costs
    nothing).

    Raises:
        OutputExistsError: saying what is wrong, naming the files.
    """
    from autoplan import plots

    check_writable_folder(Path(folder))
    if not force:
        names = ["sweep.csv", "sweep.json", *(f"{n}.png" for n in plots.SWEEP_FIGURES)]
        refuse_existing([Path(folder) / name for name in names])
