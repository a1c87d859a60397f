"""The profile ``autoplan calibrate --runs`` writes, and what using it elsewhere means.

Schema (``kind: runs``; unknown keys are an error)::

    schema: 1
    kind: runs
    parameters: {gemm_efficiency: 0.62, inter_node_efficiency: 0.41}   # applied by --profile
    memory_margin: 0.04      # applied by --profile: the memory limit divided by 1 + this
    catalog: {gemm_efficiency: 0.70, ...}      # the values before the fit, for reference
    fixed: {attention_efficiency: "the runs cannot tell it apart from gemm_efficiency"}
    fitted_on:                                  # where the parameters hold
      gpu: h100-sxm5-80gb
      runtime: fsdp
      gpus: [8, 64]                             # smallest and largest run (GPUs)
      params: [7.6e+08, 6.5e+10]                # smallest and largest model (parameters)
      runs: 21
    fit: {loss: soft_l1, f_scale: 0.05, mean_abs_error_before: 0.21, mean_abs_error_after: 0.06,
          loro_mean_abs_error: 0.08}
    runs:                                       # per run: measured, before, after, left out
      - {run: "runs.csv row 2", tokens_per_s_per_gpu: [1039, 1250.1, 1051.0, 1060.2],
         peak_memory_gib: null}

Only ``parameters`` and ``memory_margin`` are applied: everything else keeps the catalog's
values, so a profile survives changes to the cost model's other constants. ``memory_margin``
is how far a run's measured peak may exceed its prediction, from the runs' peaks against the
fits that left them out (autoplan.fit.memory_margin): a plan fits only if its predicted peak,
that much larger, does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from autoplan.costmodels.parameters import BY_NAME, with_parameters

SCHEMA = 1

SCALE_MARGIN = 2.0
"""A plan more than this factor outside the calibrated GPU count or model size is 'far
outside' the calibration: the report says so."""


class FittedOn(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpu: str
    runtime: str
    gpus: tuple[int, int]
    params: tuple[float, float]
    runs: int = Field(ge=1)


class FitFigures(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    loss: str
    f_scale: float
    mean_abs_error_before: float
    mean_abs_error_after: float
    loro_mean_abs_error: float | None = None
    memory_mean_abs_error_before: float | None = None
    memory_mean_abs_error_after: float | None = None


class RunFigures(BaseModel):
    """One run: [measured, predicted before, predicted after, predicted left out]."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run: str
    tokens_per_s_per_gpu: tuple[float, float, float, float | None]
    peak_memory_gib: tuple[float, float, float, float | None] | None = None


class RunsProfile(BaseModel):
    """A calibration fitted to measured runs (the schema above)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_: int = Field(SCHEMA, alias="schema")
    kind: Literal["runs"] = "runs"
    parameters: dict[str, float]
    memory_margin: float = Field(0.0, ge=0.0)
    catalog: dict[str, float] = {}
    fixed: dict[str, str] = {}
    fitted_on: FittedOn
    fit: FitFigures
    runs: tuple[RunFigures, ...] = ()
    source: str = ""
    """The file it was read from (not written)."""

    def apply(self, problem):
        """``problem`` with the fitted parameters and the memory margin applied."""
        return with_parameters(problem, self.parameters, memory_margin=self.memory_margin)

    def warnings(self, *, gpu: str, runtime: str, gpus: int, params: float) -> list[str]:
        """What makes these parameters doubtful for a plan of ``gpus`` GPUs of ``gpu`` running
        a model of ``params`` parameters on ``runtime``."""
        where = self.fitted_on
        name = self.source or "the profile"
        out = []
        if gpu != where.gpu:
            out.append(f"{name} was fitted on {where.gpu} but this cluster has {gpu}: its "
                       "efficiencies are those of another GPU.")
        if runtime != where.runtime:
            out.append(f"{name} was fitted on runtime {where.runtime} but this plan runs "
                       f"{runtime}: its overlap and memory behaviour differ.")
        low, high = where.gpus
        if gpus < low / SCALE_MARGIN or gpus > high * SCALE_MARGIN:
            out.append(f"{name} was fitted on {low}-{high} GPUs; this plan uses {gpus}, far "
                       "outside that range: communication at this scale is extrapolated.")
        small, large = where.params
        if params < small / SCALE_MARGIN or params > large * SCALE_MARGIN:
            out.append(f"{name} was fitted on models of {small / 1e9:.3g}B-{large / 1e9:.3g}B "
                       f"parameters; this one has {params / 1e9:.3g}B, far outside that range.")
        return out


def is_runs_profile(document: object) -> bool:
    """True for a mapping written by ``calibrate --runs`` (``kind: runs``)."""
    return isinstance(document, dict) and document.get("kind") == "runs"


def runs_profile(document: dict, path: str | Path) -> RunsProfile:
    """Validate a ``kind: runs`` document; unknown parameter names are refused."""
    profile = RunsProfile.model_validate({**document, "source": str(path)})
    unknown = sorted(set(profile.parameters) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return profile


def write_runs_profile(profile: RunsProfile, path: str | Path) -> Path:
    """Write the profile YAML (without ``source``)."""
    document = profile.model_dump(mode="json", by_alias=True, exclude={"source"})
    path = Path(path)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path



def profile_from_fit(runs, result) -> RunsProfile:
    """The profile of a fit (autoplan.fit): fitted values, where, and the per-run figures."""
    from autoplan.fit import F_SCALE, LOSS, mean_abs_error

    measured = [r.tokens_per_s_per_gpu for r in runs]
    loro = result.loro or [None] * len(runs)
    rows = []
    for run, b, a, o in zip(runs, result.before, result.after, loro):
        memory = None
        if run.peak_memory_gib is not None:
            memory = (run.peak_memory_gib, b.peak_memory_gib, a.peak_memory_gib,
                      o.peak_memory_gib if o else None)
        rows.append(RunFigures(run=run.label, tokens_per_s_per_gpu=(
            run.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu, a.tokens_per_s_per_gpu,
            o.tokens_per_s_per_gpu if o else None), peak_memory_gib=memory))
    memory_runs = [(r, b, a) for r, b, a in zip(runs, result.before, result.after)
                   if r.peak_memory_gib is not None]
    figures = FitFigures(
        loss=LOSS, f_scale=F_SCALE,
        mean_abs_error_before=mean_abs_error([b.tokens_per_s_per_gpu for b in result.before], measured),
        mean_abs_error_after=mean_abs_error([a.tokens_per_s_per_gpu for a in result.after], measured),
        loro_mean_abs_error=(mean_abs_error([o.tokens_per_s_per_gpu for o in loro if o],
                                            [m for m, o in zip(measured, loro) if o])
                             if any(loro) else None),
        memory_mean_abs_error_before=mean_abs_error(
            [b.peak_memory_gib for _, b, _ in memory_runs],
            [r.peak_memory_gib for r, _, _ in memory_runs]) if memory_runs else None,
        memory_mean_abs_error_after=mean_abs_error(
            [a.peak_memory_gib for _, _, a in memory_runs],
            [r.peak_memory_gib for r, _, _ in memory_runs]) if memory_runs else None)
    first = runs[0].problem
    worlds = [r.plan.world_size for r in runs]
    sizes = [r.problem.graph.num_params for r in runs]
    return RunsProfile(
        parameters=result.values, memory_margin=result.memory_margin, catalog=result.catalog,
        fixed=result.fixed,
        fitted_on=FittedOn(gpu=first.cluster.gpu.name, runtime=first.training.runtime.value,
                           gpus=(min(worlds), max(worlds)), params=(min(sizes), max(sizes)),
                           runs=len(runs)),
        fit=figures, runs=tuple(rows))
