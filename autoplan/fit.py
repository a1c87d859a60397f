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
of pivoted QR, largest remaining effect first); a parameter no run depends on, one the runs
cannot tell apart from the parameters already chosen, or a throughput parameter that the
runs, scattered by F_SCALE, would pin down less well than the catalog does (:func:`loosest`:
its standard deviation beyond the log of its ``prior_factor``) stays at its catalog value, and at most
``runs - 1`` parameters are fitted per kind (time, memory). Which were fixed and why is
part of the result. A weakly identified parameter is kept at the catalog's value rather than
fitted with a prior beside the runs: a prior biases what the runs do identify (a noise-free
round trip found a GEMM efficiency of 0.574 for 0.55), and left free, such a parameter goes
where the runs' noise sends it (to a bound, or trading against another: attention efficiency
0.34 -> 0.92 against NVLink 1.07 -> 0.46 on nine runs of benchmarks/calibration_sweep.py).

The leave-one-run-out (LORO) error refits without each run in turn (same selection rule on the
remaining runs) and predicts the run left out: the error to expect on a run the fit never saw.
How far a left-out run's measured peak memory may exceed its prediction (median plus two
robust standard deviations) is the fit's memory margin (:func:`memory_margin`): a profile
applies it to the memory limit, so a configuration judged to fit after calibration fits with
the error the fit itself showed, and "fits" stays conservative where the memory terms were
fitted on a handful of runs.
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

PIVOT_TIE = 1e-9
"""Columns this close in length are tied, and the one named first in costmodels/parameters.py
goes first: runs whose rings all span one node count move the NIC efficiency and the loss per
doubling of nodes identically, and the efficiency, which does not extrapolate to other node
counts, is the one to fit."""

MAD_SPREAD = 1.4826
"""Standard deviations per median absolute deviation of a normal distribution."""

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
    memory_margin: float = 0.0
    """:func:`memory_margin` of the fit (0 without memory measurements)."""


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


def _select(jacobian: np.ndarray, rows: np.ndarray, names: list[str], fixed: dict[str, str],
            *, scattered: bool) -> list[str]:
    """The identifiable parameters of one kind (rows of that kind, columns of those names);
    the others go into ``fixed`` with the reason. ``scattered``: the measurements scatter by
    about F_SCALE from run to run (throughput: clocks, network neighbours), so a parameter
    must also be pinned down better than the catalog does (:func:`loosest`); a peak memory is
    the same on every repeat of a run, so its parameters need only be separable."""
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
    chosen: list[int] = []
    for column, separable in pivot_order(block[:, sensitive]):
        name = names[sensitive[column]]
        if len(chosen) >= cap:
            fixed[name] = f"{len(rows)} run(s) identify at most {cap} parameter(s) of this kind"
        elif not separable:
            fixed[name] = "the runs cannot tell it apart from " + ", ".join(
                [names[i] for i in chosen] or ["others"])
        elif scattered and (factor := loosest(block, chosen + [sensitive[column]], names)):
            fixed[name] = (f"with it the runs would pin {factor[0]} down only to a factor "
                           f"{factor[1]:.3g} either way, more than the catalog's "
                           f"{parameter(factor[0]).prior_factor:g}: kept at the catalog's value")
        else:
            chosen.append(sensitive[column])
    return [names[i] for i in chosen]


def loosest(block: np.ndarray, columns: list[int], names: list[str]
            ) -> tuple[str, float] | None:
    """The parameter of ``columns`` the runs pin down less well than the catalog does, with
    the factor they pin it to, or None. With runs scattered by F_SCALE about the model, the
    fitted log values have the covariance ``F_SCALE**2 (J^T J)^-1`` (J: these columns of
    ``block``, the runs' sensitivities); a standard deviation beyond the log of the parameter's
    ``prior_factor`` means the fit would spend it on the runs' noise (and push it to a bound)
    rather than measure it. Parameters join in pivot order, each only if every one chosen
    stays pinned: runs that barely exercise a kernel class or a link leave it at the catalog's
    value."""
    j = block[:, columns]
    spread = F_SCALE * np.sqrt(np.maximum(np.diag(np.linalg.pinv(j.T @ j)), 0.0))
    ratio = [s / math.log(parameter(names[c]).prior_factor) for s, c in zip(spread, columns)]
    worst = int(np.argmax(ratio))
    if ratio[worst] <= 1.0:
        return None
    return names[columns[worst]], math.exp(min(spread[worst], 50.0))


def pivot_order(block: np.ndarray) -> list[tuple[int, bool]]:
    """The columns in the order of column-pivoted QR (largest remaining effect first, ties to
    the first of them: PIVOT_TIE), each
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
        largest = max(np.linalg.norm(residuals[c]) for c in remaining)
        column = min(c for c in remaining
                     if np.linalg.norm(residuals[c]) >= largest * (1 - PIVOT_TIE))
        remaining.remove(column)
        left = np.linalg.norm(residuals[column])
        separable = left >= COLLINEARITY_TOL * np.linalg.norm(block[:, column]) and left > 0
        if separable:
            basis.append(residuals[column] / left)
        out.append((column, separable))
    return out


def _free_parameters(runs: Sequence[FitRun], catalog: dict[str, float]
                     ) -> tuple[list[str], dict[str, str]]:
    """The identifiable parameters and why the others are fixed."""
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
        chosen += _select(sub, rows, [names[i] for i in columns], fixed,
                          scattered=kind == "time")
    return [n for n in names if n in chosen], fixed


def _bounds(names: list[str], catalog: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Log-space bounds of the fit, always containing the catalog value (a parameter whose
    catalog value lay outside its range would be moved by the bound alone)."""
    lower = [math.log(min(max(parameter(n).lower, 1e-6 * catalog[n]), catalog[n]) / catalog[n])
             for n in names]
    upper = [math.log(max(parameter(n).upper, catalog[n]) / catalog[n]) for n in names]
    return np.array(lower), np.array(upper)


def _solve(runs: Sequence[FitRun], names: list[str], catalog: dict[str, float],
           x0: np.ndarray | None = None) -> dict[str, float]:
    if not names:
        return {}
    lower, upper = _bounds(names, catalog)
    start = np.clip(np.zeros(len(names)) if x0 is None else x0, lower + 1e-9, upper - 1e-9)
    solution = least_squares(lambda x: _residuals(runs, _values(names, x, catalog)), start,
                             bounds=(lower, upper), loss=LOSS,
                             f_scale=F_SCALE, diff_step=1e-3, x_scale=1.0, max_nfev=200)
    return _values(names, solution.x, catalog)


def catalog_values(runs: Sequence[FitRun]) -> dict[str, float]:
    """The catalog value of every parameter that applies to some run (from the first run that
    has its place: a one-node run without network links does not hide the others' network)."""
    catalog: dict[str, float] = {}
    for run in runs:
        for name, value in parameter_values(run.problem).items():
            catalog.setdefault(name, value)
    return catalog


def _start(names: list[str], values: dict[str, float], catalog: dict[str, float]) -> np.ndarray:
    return np.array([math.log(values.get(n, catalog[n]) / catalog[n]) for n in names])


def fit(runs: Sequence[FitRun], *, leave_one_out: bool = True) -> FitResult:
    """Fit the identifiable parameters to ``runs`` (all on one GPU and runtime)."""
    catalog = catalog_values(runs)
    names, fixed = _free_parameters(runs, catalog)
    values = _solve(runs, names, catalog)
    result = FitResult(values=values, catalog=catalog, fixed=fixed,
                       before=[predict(r, {}) for r in runs],
                       after=[predict(r, values) for r in runs])
    if leave_one_out:
        result.loro = [_left_out(runs, i, catalog, values) for i in range(len(runs))]
    result.memory_margin = memory_margin(runs, result.loro if any(result.loro) else result.after)
    return result


def memory_margin(runs: Sequence[FitRun], predictions: Sequence[Prediction | None]) -> float:
    """How much larger than predicted a peak may be: of the shares by which the measured
    peaks exceed their predictions (``measured / predicted - 1``, the left-out predictions
    where there are: the error on runs the fit did not see), the median plus two robust
    standard deviations (MAD_SPREAD median absolute deviations), at least 0. About the 98th
    percentile of normal errors, without letting one badly predicted run (a node's whole
    nvidia-smi memory beside the others' allocator peaks) refuse every plan near the limit."""
    under = np.array([run.peak_memory_gib / p.peak_memory_gib - 1
                      for run, p in zip(runs, predictions)
                      if run.peak_memory_gib is not None and p is not None])
    if not len(under):
        return 0.0
    median = float(np.median(under))
    spread = MAD_SPREAD * float(np.median(np.abs(under - median)))
    return max(0.0, median + 2 * spread)


def _left_out(runs: Sequence[FitRun], i: int, catalog: dict[str, float],
              full: dict[str, float]) -> Prediction | None:
    """Run ``i`` predicted by a fit on the others of the full fit's parameters that they
    identify (started from the full fit)."""
    others = [r for k, r in enumerate(runs) if k != i]
    if not others:
        return None
    names = [n for n in _free_parameters(others, catalog)[0] if n in full]
    return predict(runs[i], _solve(others, names, catalog, _start(names, full, catalog)))


def mean_abs_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean of |predicted / measured - 1| (what the accuracy benchmarks report)."""
    pairs = [(p, m) for p, m in zip(predicted, measured) if m is not None and p is not None]
    return sum(abs(p / m - 1) for p, m in pairs) / len(pairs) if pairs else float("nan")
