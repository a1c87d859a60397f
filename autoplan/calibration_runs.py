"""``autoplan calibrate --runs``: measured runs (runs.csv rows, training logs) traced and
planned as the fit takes them (autoplan.fit.FitRun), fitted, and written as a runs profile
(autoplan.run_profile)."""

from __future__ import annotations

import math
from pathlib import Path

from autoplan.cluster.loaded import LoadedCluster, load_cluster
from autoplan.errors import AutoplanError
from autoplan.files import refuse_existing
from autoplan.fit import FitRun, fit
from autoplan.graph.model import Model, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.run_profile import RunsProfile, profile_from_fit, write_runs_profile
from autoplan.runs import MeasuredRun, RunsError, read_runs
from autoplan.search.defaults import plan_for


def calibrate_runs(runs: list[str | Path], out: str | Path, *,
                   model: str | Path | Model | None = None,
                   cluster: str | Path | LoadedCluster | None = None,
                   force: bool = False, leave_one_out: bool = True) -> RunsProfile:
    """Fit the global physical parameters to the runs and write the profile YAML to ``out``
    (see :func:`autoplan.api.calibrate_runs`)."""
    if not force:
        refuse_existing([Path(out)])
    measured = [run for source in runs for run in read_runs(source, model=model, cluster=cluster)]
    prepared = fit_runs(measured)
    profile = profile_from_fit(prepared, fit(prepared, leave_one_out=leave_one_out))
    write_runs_profile(profile, out)
    return profile.model_copy(update={"source": str(out)})


def fit_runs(measured: list[MeasuredRun]) -> list[FitRun]:
    """Each measured run traced and planned (autoplan.fit.FitRun), all on one GPU and runtime.

    Raises:
        RunsError: naming the run (row) and the column at fault.
    """
    models: dict[Path, Model] = {}
    clusters: dict[Path, LoadedCluster] = {}
    out = []
    for run in measured:
        try:
            cluster = clusters.get(run.cluster) or clusters.setdefault(
                run.cluster, load_cluster(run.cluster))
        except AutoplanError as err:
            raise RunsError(f"{run.label}, column cluster: {err}") from None
        world = math.prod(run.pins.get(k, 1) for k in ("tp", "pp", "dp", "cp"))
        if "dp" in run.pins and world > cluster.cluster.num_gpus:
            raise RunsError(
                f"{run.label}, columns tp,pp,dp,cp: tp*pp*dp*cp = {world} GPUs but "
                f"{run.cluster.name} has {cluster.cluster.num_gpus}; give the cluster the run "
                "used or the degrees it ran with.")
        model = models.setdefault(run.model, load_model(run.model))
        training = training_spec(run.seq_len, run.global_batch, run.precision or "bf16",
                                 run.runtime, "flash")
        try:
            problem = make_problem(model, cluster, training)
        except AutoplanError as err:
            raise RunsError(f"{run.label}, column model: {run.model} does not trace: {err}") from None
        try:
            plan = plan_for(problem, model, run.pins)
        except AutoplanError as err:
            raise RunsError(f"{run.label}, columns tp,pp,dp,cp,mbs: {err}") from None
        tokens = run.tokens_per_s_per_gpu or (
            run.global_batch * run.seq_len / (run.step_time_s * plan.world_size))
        out.append(FitRun(run.label, problem, plan, tokens, run.peak_memory_gib))
    same_hardware_and_runtime(out)
    return out


def same_hardware_and_runtime(runs: list[FitRun]) -> None:
    """A calibration is of one runtime on one GPU: refuse runs that mix them."""
    first = runs[0]
    for run in runs[1:]:
        for column, value, reference in (
                ("cluster", run.problem.cluster.gpu.name, first.problem.cluster.gpu.name),
                ("runtime", run.problem.training.runtime.value,
                 first.problem.training.runtime.value)):
            if value != reference:
                raise RunsError(
                    f"{run.label}, column {column}: {value}, but {first.label} has {reference}. "
                    "A calibration fits one runtime on one GPU; calibrate each separately.")
