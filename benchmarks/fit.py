"""Pose published runs once and re-estimate them with the fitted constants changed: what
accuracy.py's leave-one-source-out and refit_profiles.py share.

The constants are those named in costmodels.profiles.FITTED, global (one value each):
``compute.<field>`` scales that field of every GPU's compute profile (1 = as profiles.yaml has
it, capped at 1 of peak), ``<runtime>.<field>`` sets that field of one runtime's profile.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_for
from autoplan.errors import AutoplanError
from autoplan.costmodels.profiles import FITTED, fit_grid
from autoplan.costmodels.problem import Problem
from autoplan.costmodels.step import estimate
from autoplan.plan import Plan
from published_runs import PublishedRun


@dataclass(frozen=True)
class Question:
    run: PublishedRun
    problem: Problem
    plan: Plan


def pose(runs: list[PublishedRun]) -> tuple[list[Question], list[tuple[PublishedRun, str]]]:
    """Each run traced and planned once (a model shared by runs is traced once per sequence
    length); (the questions, the runs autoplan refused with its message)."""
    models: dict[int, object] = {}
    out, refused = [], []
    for run in runs:
        model = models.setdefault(id(run.model), load_model(run.model))
        try:
            cluster = load_cluster(run.cluster)
            training = training_spec(run.seq_len, run.global_batch, run.precision, run.runtime,
                                 run.attention)
            problem = make_problem(model, cluster, training,
                                   runtime_settings=run.runtime_settings)
            out.append(Question(run, problem, plan_for(problem, model, run.pins)))
        except AutoplanError as err:
            refused.append((run, str(err)))
    return out, refused


def _changed(problem: Problem, values: dict[str, float]) -> Problem:
    compute, runtime = {}, {}
    for key, value in values.items():
        section, name = key.split(".")
        if section == "compute":
            compute[name] = min(1.0, getattr(problem.compute, name) * value)
        elif section == problem.runtime.name:
            runtime[name] = value
    if not compute and not runtime:
        return problem
    return dataclasses.replace(
        problem, compute=dataclasses.replace(problem.compute, **compute),
        runtime=dataclasses.replace(problem.runtime, **runtime))


def predict_all(questions: list[Question], values: dict[str, float]) -> list[float]:
    """Relative error (predicted / measured - 1) of each question under ``values``."""
    return [estimate(_changed(q.problem, values), q.plan).step_time_s / q.run.step_time_s - 1
            for q in questions]


def _relevant(questions: list[Question], key: str) -> list[Question]:
    section = key.split(".")[0]
    return [q for q in questions if section in ("compute", q.problem.runtime.name)]


def fit(questions: list[Question], rounds: int = 1) -> dict[str, float]:
    """Coordinate descent over FITTED on the mean absolute error of ``questions``: each
    constant in turn takes the grid value (costmodels.profiles.fit_grid) that scores best with
    the others held, scored on the questions it affects. Constants no question depends on are
    left out."""
    values: dict[str, float] = {}
    for _ in range(rounds):
        for key in FITTED:
            relevant = _relevant(questions, key)
            if not relevant:
                continue
            values[key] = min(fit_grid(key), key=lambda v: sum(
                map(abs, predict_all(relevant, values | {key: v}))))
    return values
