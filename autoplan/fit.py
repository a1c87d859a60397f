"""Fit the global physical parameters (costmodels/parameters.py) to measured runs.

The residual of a run is the log of predicted over measured throughput (tokens/s/GPU), and, for
runs that report it, the log of predicted over measured peak memory: the allocator-reserved peak
(``torch.cuda.max_memory_reserved``, what runs.csv's ``peak_memory_gib``, Megatron-LM's ``max
reserved`` and torchtitan's ``memory:`` state) against the model's reserved peak, so the CUDA
context and NCCL buffers outside the allocator keep their catalog size; a whole-device
measurement (nvidia-smi, ``FitRun.whole_device``) against the model's whole peak. Parameters are fitted in
log space relative to their catalog value (a parameter at 0 is left alone) by robust least
squares (``scipy.optimize.least_squares``, ``loss="soft_l1"`` with a 5% scale: one odd run
pulls the fit linearly, not quadratically).

Never one knob per run: a parameter is fitted only if the runs identify it. The Jacobian of the
residuals at the catalog values is factorised with column pivoting (Gram-Schmidt in the order
of pivoted QR, largest remaining effect first); a parameter no run depends on, or one the runs
cannot tell apart from the parameters already chosen, stays at its catalog value, and at most ``runs - 1`` parameters are fitted per kind (time, memory). Which
were fixed and why is part of the result.

The leave-one-run-out (LORO) error refits without each run in turn (same selection rule on the
remaining runs) and predicts the run left out: the error to expect on a run the fit never saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares

from autoplan.costmodels.parameters import parameter, parameter_values, with_parameters
from autoplan.costmodels.problem import Problem
from autoplan.costmodels.step import estimate as estimate_plan
from autoplan.plan import Plan

LOSS, F_SCALE = "soft_l1", 0.05
"""Robust loss and the residual (log ratio, about a relative error) where it turns linear."""

JACOBIAN_STEP = 0.05
"""Log-space step of the identifiability Jacobian: a 5% change, large enough to see through the
cost model's small kinks (max of overlapped terms, rounding)."""

SENSITIVITY_FLOOR = 1e-3
"""A parameter whose 1% change moves no run's prediction by more than 0.001% is not identified."""

COLLINEARITY_TOL = 0.05
"""Pivoted-QR diagonal below this fraction of the first: not separable from those chosen."""

GIB = 2**30


@dataclass(frozen=True)
class FitRun:
    """A measured run ready to predict: its problem (traced), plan and measurements."""

    label: str
    problem: Problem
    plan: Plan
    tokens_per_s_per_gpu: float
    peak_memory_gib: float | None = None
    """The allocator-reserved peak of the most loaded GPU (or, with ``whole_device``, all the
    memory it used)."""
    whole_device: bool = False
    """The memory measured is the device's whole use (nvidia-smi: CUDA context, NCCL buffers
    and the allocator's cache), not the allocator's reserved peak."""


@dataclass(frozen=True)
class Prediction:
    tokens_per_s_per_gpu: float
    peak_memory_gib: float


@dataclass
class FitResult:
    """Fitted values, what was fixed and why, and the per-run and leave-one-out figures."""

    values: dict[str, float]
    """The fitted parameters only (others keep the catalog's)."""
    catalog: dict[str, float]
    fixed: dict[str, str]
    before: list[Prediction]
    after: list[Prediction]
    loro: list[Prediction | None] = field(default_factory=list)
    """Each run predicted by a fit without it (None with a single run)."""


def predict(run: FitRun, values: dict[str, float]) -> Prediction:
    """What the cost model says of ``run`` with the parameters set to ``values``."""
    est = estimate_plan(with_parameters(run.problem, values), run.plan)
    memory = est.peak_memory_gib if run.whole_device else est.peak_reserved_gib
    return Prediction(est.tokens_per_s / run.plan.world_size, memory)


def _residuals(runs: Sequence[FitRun], values: dict[str, float]) -> np.ndarray:
    out = []
    for run in runs:
        p = predict(run, values)
        out.append(math.log(p.tokens_per_s_per_gpu / run.tokens_per_s_per_gpu))
        if run.peak_memory_gib is not None:
            out.append(math.log(p.peak_memory_gib / run.peak_memory_gib))
    return np.array(out)


def _row_kinds(runs: Sequence[FitRun]) -> list[str]:
    kinds = []
    for run in runs:
        kinds.append("time")
        if run.peak_memory_gib is not None:
            kinds.append("memory")
    return kinds


def _values(names: list[str], x: np.ndarray, catalog: dict[str, float]) -> dict[str, float]:
    return {n: catalog[n] * math.exp(v) for n, v in zip(names, x)}


def _jacobian(runs: Sequence[FitRun], names: list[str], catalog: dict[str, float]) -> np.ndarray:
    """d residual / d log(parameter), by central differences of JACOBIAN_STEP."""
    columns = []
    for name in names:
        up = _residuals(runs, {name: catalog[name] * math.exp(JACOBIAN_STEP)})
        down = _residuals(runs, {name: catalog[name] * math.exp(-JACOBIAN_STEP)})
        columns.append((up - down) / (2 * JACOBIAN_STEP))
    return np.array(columns).T


def _select(jacobian: np.ndarray, rows: np.ndarray, names: list[str], fixed: dict[str, str]
            ) -> list[str]:
    """The identifiable parameters of one kind (rows of that kind, columns of those names);
    the others go into ``fixed`` with the reason."""
    if not len(rows):
        for name in names:
            fixed[name] = "no measured run reports what it affects"
        return []
    block = jacobian[rows]
    sensitive = [i for i in range(len(names))
                 if np.max(np.abs(block[:, i])) > SENSITIVITY_FLOOR]
    for i, name in enumerate(names):
        if i not in sensitive:
            fixed[name] = "no run's prediction depends on it"
    if not sensitive:
        return []
    cap = max(0, len(rows) - 1)
    chosen: list[str] = []
    for column, separable in pivot_order(block[:, sensitive]):
        name = names[sensitive[column]]
        if len(chosen) >= cap:
            fixed[name] = f"{len(rows)} run(s) identify at most {cap} parameter(s) of this kind"
        elif not separable:
            fixed[name] = "the runs cannot tell it apart from " + ", ".join(chosen or ["others"])
        else:
            chosen.append(name)
    return chosen


def pivot_order(block: np.ndarray) -> list[tuple[int, bool]]:
    """The columns in the order of column-pivoted QR (largest remaining effect first), each
    with whether it is separable from those before it: the part of it no combination of the
    earlier separable columns explains is at least COLLINEARITY_TOL of its own length.

    Judging each column against its own length, not the first column's, keeps a parameter
    with a small but distinct effect (a link's efficiency beside the GEMM efficiency, which
    moves every run) when the runs do tell it apart."""
    remaining = list(range(block.shape[1]))
    basis: list[np.ndarray] = []
    out = []
    while remaining:
        residuals = {c: block[:, c] - sum((b @ block[:, c]) * b for b in basis)
                     for c in remaining}
        column = max(remaining, key=lambda c: (np.linalg.norm(residuals[c]), -c))
        remaining.remove(column)
        left = np.linalg.norm(residuals[column])
        separable = left >= COLLINEARITY_TOL * np.linalg.norm(block[:, column]) and left > 0
        if separable:
            basis.append(residuals[column] / left)
        out.append((column, separable))
    return out


def _free_parameters(runs: Sequence[FitRun], catalog: dict[str, float]
                     ) -> tuple[list[str], dict[str, str]]:
    fixed: dict[str, str] = {}
    names = []
    for name in catalog:
        if catalog[name] > 0:
            names.append(name)
        else:
            fixed[name] = "its catalog value is 0 (a scale fit cannot move it)"
    jacobian = _jacobian(runs, names, catalog)
    kinds = np.array(_row_kinds(runs))
    chosen = []
    for kind in ("time", "memory"):
        columns = [i for i, n in enumerate(names) if parameter(n).affects == kind]
        rows = np.flatnonzero(kinds == kind)
        sub = jacobian[:, columns] if columns else np.zeros((len(kinds), 0))
        chosen += _select(sub, rows, [names[i] for i in columns], fixed)
    return [n for n in names if n in chosen], fixed


def _solve(runs: Sequence[FitRun], names: list[str], catalog: dict[str, float],
           x0: np.ndarray | None = None) -> dict[str, float]:
    if not names:
        return {}
    lower = np.array([math.log(max(parameter(n).lower, 1e-6 * catalog[n]) / catalog[n])
                      for n in names])
    upper = np.array([math.log(parameter(n).upper / catalog[n]) for n in names])
    start = np.clip(np.zeros(len(names)) if x0 is None else x0, lower + 1e-9, upper - 1e-9)
    solution = least_squares(lambda x: _residuals(runs, _values(names, x, catalog)), start,
                             bounds=(lower, upper), loss=LOSS, f_scale=F_SCALE,
                             diff_step=1e-3, x_scale=1.0, max_nfev=200)
    return _values(names, solution.x, catalog)


def fit(runs: Sequence[FitRun], *, leave_one_out: bool = True) -> FitResult:
    """Fit the identifiable parameters to ``runs`` (all on one GPU and runtime)."""
    catalog = parameter_values(runs[0].problem)
    names, fixed = _free_parameters(runs, catalog)
    values = _solve(runs, names, catalog)
    result = FitResult(values=values, catalog=catalog, fixed=fixed,
                       before=[predict(r, {}) for r in runs],
                       after=[predict(r, values) for r in runs])
    if leave_one_out:
        result.loro = [_left_out(runs, i, catalog, values) for i in range(len(runs))]
    return result


def _left_out(runs: Sequence[FitRun], i: int, catalog: dict[str, float],
              full: dict[str, float]) -> Prediction | None:
    """Run ``i`` predicted by a fit on the others (started from the full fit)."""
    others = [r for k, r in enumerate(runs) if k != i]
    if not others:
        return None
    names, _ = _free_parameters(others, catalog)
    start = np.array([math.log(full.get(n, catalog[n]) / catalog[n]) for n in names])
    return predict(runs[i], _solve(others, names, catalog, start))


def mean_abs_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean of |predicted / measured - 1| (what the accuracy benchmarks report)."""
    pairs = [(p, m) for p, m in zip(predicted, measured) if m is not None and p is not None]
    return sum(abs(p / m - 1) for p, m in pairs) / len(pairs) if pairs else float("nan")
