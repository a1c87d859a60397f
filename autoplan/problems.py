"""The question asked, assembled from the caller's inputs: the training settings (checked
against the enums they name), the runtime's profile with a run's own settings, the compute
profile (the catalog's or a calibration's) and the :class:`Problem` that search and estimate
take, one per allowed global batch."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, TypeVar

from autoplan.calibrate import load_profile
from autoplan.capabilities import require_in_backward_runtime
from autoplan.cluster.loaded import LoadedCluster
from autoplan.cluster.spec import Cluster
from autoplan.costmodels.fused_kernels import check_impl
from autoplan.costmodels.fused_softmax import check_fused_softmax
from autoplan.costmodels.problem import Problem
from autoplan.costmodels.profiles import (ATTENTION_KERNELS, ComputeProfile, RuntimeProfile,
                                          compute_profile, runtime_profile, with_gradient_dtype)
from autoplan.costmodels.tp_overlap import frozen_cfg
from autoplan.errors import ConstraintError
from autoplan.graph.model import Model
from autoplan.options import mem_limit_bytes, validated
from autoplan.plugins.importers import ImportedRun
from autoplan.run_profile import RunsProfile
from autoplan.search.space import check_ep_cluster, check_pins
from autoplan.training import (
    AttentionKernel, FrozenDtype, Optimizer, Pins, Precision, Runtime, TrainingSpec,
)

Profile = ComputeProfile | RunsProfile
"""A calibration: a measured compute profile, or global parameters fitted to runs."""

E = TypeVar("E", bound=Enum)


def loaded_profile(profile: str | Path | Profile | None) -> Profile | None:
    """A --profile: None, an already loaded one, or the path of its YAML."""
    if profile is None or isinstance(profile, (ComputeProfile, RunsProfile)):
        return profile
    return load_profile(profile)


def choice(enum: type[E], value: str, name: str) -> E:
    """``value`` as a member of ``enum``, or a ConstraintError listing the members."""
    try:
        return enum(value)
    except ValueError:
        raise ConstraintError(f"{name} {value!r} is not known; choose one of "
                              f"{', '.join(e.value for e in enum)}.") from None


def training_spec(seq_len: int, global_batch: int, precision: str, runtime: str,
                  attention: str, optimizer: str | None = None,
                  frozen_dtype: str | None = None,
                  optimizer_in_backward: bool = False) -> TrainingSpec:
    """The training settings of one question, each checked against the choices it has."""
    if optimizer_in_backward:
        require_in_backward_runtime(choice(Runtime, runtime, "--runtime"))
    return validated(TrainingSpec, {
        "seq_len": seq_len, "global_batch": global_batch,
        "precision": choice(Precision, precision, "--precision"),
        "runtime": choice(Runtime, runtime, "--runtime"),
        "attention": choice(AttentionKernel, attention, "attention"),
        "optimizer": choice(Optimizer, optimizer or "adamw", "--optimizer"),
        "frozen_dtype": frozen_dtype and choice(FrozenDtype, frozen_dtype, "--frozen-dtype"),
        "optimizer_in_backward": optimizer_in_backward},
        "training settings")


def training_settings(run: ImportedRun | None, seq_len: int | None, global_batch: int | None,
                      precision: str | None, runtime: str | None, *,
                      default_runtime: str = "megatron") -> tuple[int, int, str, str]:
    """Training settings: the caller's, else the imported configuration's, else defaults
    (``auto`` for solve: every runtime compared; megatron for estimate)."""
    seq_len = seq_len or (run.seq_len if run else None)
    global_batch = global_batch or (run.global_batch if run else None)
    if not seq_len or not global_batch:
        raise ConstraintError(
            "give --seq-len and --global-batch (the imported configuration does not state "
            "them).")
    return (seq_len, global_batch, precision or (run.precision if run else None) or "bf16",
            runtime or (run.runtime if run else default_runtime))


def runtime_with(runtime: RuntimeProfile, settings: Mapping[str, Any] | None) -> RuntimeProfile:
    """The runtime's profile with some fields replaced: how a particular run was configured or
    what its framework version could do, e.g. ``{"tp_bwd_overlap": False}`` for Megatron-LM
    before its asynchronous TP all-reduce or ``{"overlap_grad_reduce": False}`` for a launch
    without ``--overlap-grad-reduce``."""
    if not settings:
        return runtime
    known = {f.name for f in dataclasses.fields(RuntimeProfile)} - {"name", "source"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConstraintError(f"runtime settings {', '.join(unknown)} are not known; choose from "
                              f"{', '.join(sorted(known))}.")
    check_impl(settings.get("transformer_impl"))
    check_fused_softmax(settings.get("fused_softmax_check"))
    impl = settings.get("transformer_impl", runtime.transformer_impl)
    if settings.get("tp_comm_overlap") and impl != "transformer_engine":
        raise ConstraintError("runtime setting tp_comm_overlap is Transformer Engine's "
                              f"userbuffers overlap; the runtime's transformer_impl is {impl!r}: "
                              "set transformer_impl: transformer_engine or drop tp_comm_overlap.")
    kernel = settings.get("attention_kernel", runtime.attention_kernel)
    if kernel not in ATTENTION_KERNELS:
        raise ConstraintError(f"runtime setting attention_kernel {kernel!r} is not a kernel "
                              f"autoplan prices; choose from {', '.join(ATTENTION_KERNELS)}.")
    if settings.get("grad_reduce_in_bf16") and runtime.name != "megatron":
        raise ConstraintError(f"runtime setting grad_reduce_in_bf16 is Megatron-LM's "
                              f"--grad-reduce-in-bf16; the {runtime.name} runtime sets its "
                              "gradients' dtype itself. Plan with --runtime megatron or drop "
                              "the setting.")
    if "tp_comm_overlap_cfg" in settings:
        settings = {**settings, "tp_comm_overlap_cfg": frozen_cfg(settings["tp_comm_overlap_cfg"])}
    return with_gradient_dtype(dataclasses.replace(runtime, **settings))


def _compute(cluster: Cluster, profile: Profile | None) -> ComputeProfile:
    """The measured compute profile, else the catalog's for the cluster's GPU."""
    if isinstance(profile, ComputeProfile):
        return profile
    return compute_profile(cluster.gpu.name)


def require_fp8_support(training: TrainingSpec, cluster: Cluster,
                        runtime: RuntimeProfile) -> None:
    """FP8 training needs FP8 tensor cores on every GPU of the cluster (the catalog's ``fp8``
    peak; V100 and A100 have none, and Transformer Engine refuses FP8 below compute capability
    8.9) and Transformer Engine's layers (not Megatron-LM's ``local`` ones).

    Raises:
        ConstraintError: ``--precision fp8`` on a cluster with a GPU that lacks them, or with
            ``transformer_impl: local``.
    """
    if training.precision is not Precision.FP8:
        return
    if runtime.transformer_impl == "local":
        raise ConstraintError("--precision fp8 runs in Transformer Engine's layers; drop the "
                              "runtime setting transformer_impl: local (or train in bf16).")
    lacking = sorted({c.gpu.name for c in (cluster, *cluster.groups) if c.gpu.fp8_flops is None})
    if lacking:
        raise ConstraintError(
            f"--precision fp8: {', '.join(lacking)} has no FP8 tensor cores (the catalog gives "
            "it no fp8 peak; Transformer Engine needs Hopper, Ada or Blackwell). Train in bf16 "
            "(--precision bf16) or plan on H100/H200/L40S/RTX 4090 GPUs.")


def make_problem(model: Model, cluster: LoadedCluster, training: TrainingSpec,
                 mem_limit: str | float | None = None, *,
                 profile: str | Path | Profile | None = None,
                 runtime_settings: Mapping[str, Any] | None = None,
                 headroom: float = 0.0) -> Problem:
    """Trace the model and gather the cost-model inputs for one question. ``profile`` (a
    profile YAML from ``autoplan calibrate``, a ComputeProfile or a RunsProfile) replaces the
    catalog's compute profile of the cluster's GPU (of its first node group's GPU on a
    heterogeneous cluster), or, fitted to runs, the parameters it names
    (costmodels.parameters); ``runtime_settings`` replaces fields of the runtime's profile
    (see :func:`runtime_with`); ``headroom`` the fraction of the limit plans must leave free."""
    profile = loaded_profile(profile)
    runtime = runtime_with(runtime_profile(training.runtime.value, training.precision.value),
                           runtime_settings)
    require_fp8_support(training, cluster.cluster, runtime)
    graph = model.trace(training.seq_len, training.precision.value)
    if not cluster.cluster.is_homogeneous and not graph.block_indices():
        raise ConstraintError(
            f"{model.name} traces into no repeated blocks, so its layers cannot be shared out "
            "over the node groups of a heterogeneous cluster; plan it on one group (give that "
            "group's nodes as a cluster of their own).")
    problem = Problem(
        graph=graph, cluster=cluster.cluster, training=training,
        runtime=runtime,
        compute=_compute(cluster.cluster, profile),
        mem_limit_bytes=mem_limit_bytes(mem_limit, cluster.cluster) * (1 - headroom),
        headroom=headroom,
    )
    if isinstance(profile, RunsProfile):
        return profile.apply(problem)
    return problem


def batch_problems(model: Model, cluster: LoadedCluster, batches: list[int] | None, pins: Pins,
                   *, seq_len: int, precision: str, runtime: str, attention: str,
                   mem_limit: str | float | None, profile: Profile | None = None,
                   optimizer: str | None = None, frozen_dtype: str | None = None,
                   headroom: float = 0.0, optimizer_in_backward: bool = False,
                   made: dict[TrainingSpec, Problem] | None = None,
                   runtime_settings: Mapping[str, Any] | None = None) -> list[Problem]:
    """One problem per allowed global batch whose pins are legal (all checked if none is).
    ``made``: the problems of earlier calls by their training settings, reused (with the memo
    of what was evaluated on them) rather than made again; ``runtime_settings`` as
    :func:`make_problem` (one runtime's: ``made`` is keyed by the training settings alone)."""
    made = {} if made is None else made
    if not batches:
        raise ConstraintError("give --global-batch (or global_batch in --options).")
    check_ep_cluster(cluster.cluster, pins.ep)
    problems, errors = [], []
    for batch in batches:
        training = training_spec(seq_len, batch, precision, runtime, attention, optimizer,
                                 frozen_dtype, optimizer_in_backward)
        if training not in made:
            made[training] = make_problem(model, cluster, training, mem_limit, profile=profile,
                                          headroom=headroom, runtime_settings=runtime_settings)
        problem = made[training]
        try:
            check_pins(problem.graph, world=cluster.cluster.num_gpus, training=training, pins=pins)
        except ConstraintError as err:
            errors.append(err)
            continue
        problems.append(problem)
    if not problems:
        raise errors[0]
    return problems
