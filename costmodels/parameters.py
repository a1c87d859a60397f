"""The global physical parameters a calibration may fit, read from and written into a Problem.

Every step time and memory figure of ``estimate()`` comes from a handful of achieved-efficiency
and overhead constants that live in three places: the GPU's compute profile (profiles.yaml
``compute``), the cluster's links (catalog.yaml / cluster.yaml) and the runtime's profile
(profiles.yaml ``runtimes``). This module names them once, so ``autoplan calibrate --runs``
can fit them to measured runs and ``--profile`` can apply the fitted values, without the cost
models knowing that a calibration exists: :func:`with_parameters` returns the same Problem
with those constants replaced.

Each parameter is one global value per (GPU, runtime, cluster), never one per run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from autoplan.cluster.spec import Cluster
from autoplan.costmodels.problem import Problem
from autoplan.errors import AutoplanError


@dataclass(frozen=True, slots=True)
class Parameter:
    """One named constant: where it lives (``compute``, ``runtime``, ``intra``, ``inter``),
    its field there, what it affects (``time`` or ``memory``), the range a fit may move it and
    how far from its catalog value a real cluster's plausibly lies (``prior_factor``)."""

    name: str
    where: str
    field: str
    affects: str
    lower: float
    upper: float
    meaning: str
    prior_factor: float = 2.0
    """The factor either way by which a cluster's value plausibly differs from the catalog's
    (one standard deviation of the fit's prior in log space, autoplan.fit): small for what
    kernel benchmarks pin down (GEMM and element-wise efficiency), 2x for NVLink (the catalog's
    figure is nccl-tests on an idle link; in training the collectives share SMs and HBM with
    compute), 3x for what a deployment changes (a shared or congested network, the launch
    path, the allocator's behaviour), 1.2x for the network's loss per doubling of nodes (what
    nccl-tests measured on EFA spans 0.84 per doubling on 2019 p3dn, NVIDIA/nccl issue 235, to
    0.965 on p5: 1.15x apart)."""


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("gemm_efficiency", "compute", "gemm_efficiency", "time", 0.05, 1.0,
              "fraction of dense peak a large GEMM reaches", 1.3),
    Parameter("attention_efficiency", "compute", "attention_efficiency", "time", 0.05, 1.0,
              "fraction of peak of the fused attention kernels", 1.5),
    Parameter("memory_efficiency", "compute", "memory_efficiency", "time", 0.05, 1.0,
              "fraction of HBM bandwidth element-wise kernels reach", 1.3),
    Parameter("kernel_overhead_s", "compute", "kernel_overhead_s", "time", 0.0, 1e-3,
              "fixed launch cost per layer and micro-batch (s)", 3.0),
    Parameter("intra_node_efficiency", "intra", "allreduce_efficiency", "time", 0.02, 1.25,
              "achieved fraction of the intra-node link bandwidth (collectives; NVLink SHARP "
              "lifts all-reduce bus bandwidth above the link rate: 1.067 on H100)", 2.0),
    Parameter("intra_node_latency_s", "intra", "latency_s", "time", 0.0, 1e-4,
              "per-hop latency of the intra-node link (s)", 3.0),
    Parameter("inter_node_efficiency", "inter", "allreduce_efficiency", "time", 0.02, 1.0,
              "achieved fraction of the NIC bandwidth (collectives across nodes)", 3.0),
    Parameter("inter_node_kept_per_doubling", "inter", "kept_per_doubling", "time", 0.5, 1.0,
              "share of the network's busbw a ring keeps each time the nodes it spans double "
              "beyond two (1.0: flat in nodes; p5 EFA 0.965); identified by runs whose groups "
              "span different node counts", 1.2),
    Parameter("inter_node_latency_s", "inter", "latency_s", "time", 0.0, 1e-3,
              "per-hop latency of the network (s): point-to-point and all-to-all", 3.0),
    Parameter("inter_node_net_latency_s", "inter", "nccl_net_latency_s", "time", 0.0, 2e-3,
              "latency per network step of NCCL's collectives across nodes (s): what the "
              "network plugin adds in NCCL's tuning model (EFA 75 us, 0 on InfiniBand)", 3.0),
    Parameter("memory_fragmentation", "runtime", "fragmentation", "memory", 0.0, 2.0,
              "allocator overhead as a fraction of activation memory", 3.0),
    Parameter("cuda_context_bytes", "runtime", "cuda_context_bytes", "memory", 0.0, 16 * 2**30,
              "CUDA context, cuBLAS/NCCL workspaces per GPU (bytes)", 2.0),
)
"""The calibratable constants, by the names profiles and reports use."""

BY_NAME = {p.name: p for p in PARAMETERS}


class UnknownParameterError(AutoplanError):
    """A profile names a parameter this version does not have."""

    exit_code = 2


def parameter(name: str) -> Parameter:
    """The parameter called ``name``."""
    if name not in BY_NAME:
        raise UnknownParameterError(
            f"unknown calibration parameter {name!r}; known: {', '.join(BY_NAME)}.")
    return BY_NAME[name]


def _holder(problem: Problem, where: str):
    if where == "compute":
        return problem.compute
    if where == "runtime":
        return problem.runtime
    return problem.cluster.intra if where == "intra" else problem.cluster.inter


def applies(problem: Problem, name: str) -> bool:
    """False for a parameter the problem has no place for (inter-node on one node)."""
    return _holder(problem, parameter(name).where) is not None


def parameter_values(problem: Problem) -> dict[str, float]:
    """The current value of every parameter that applies to ``problem``."""
    return {p.name: float(getattr(_holder(problem, p.where), p.field))
            for p in PARAMETERS if _holder(problem, p.where) is not None}


def _replaced(obj, changes: dict):
    return dataclasses.replace(obj, **changes) if changes and obj is not None else obj


def _cluster_with(cluster: Cluster, intra: dict, inter: dict) -> Cluster:
    """The cluster (and each of its node groups) with link fields replaced."""
    groups = tuple(_cluster_with(g, intra, inter) for g in cluster.groups)
    return dataclasses.replace(cluster, intra=_replaced(cluster.intra, intra),
                               inter=_replaced(cluster.inter, inter), groups=groups)


def with_parameters(problem: Problem, values: Mapping[str, float], *,
                    memory_margin: float = 0.0) -> Problem:
    """``problem`` with the named parameters set to ``values`` (others unchanged); a parameter
    whose place the problem lacks (inter-node links on one node) is skipped. ``memory_margin``
    (a calibration's, autoplan.fit.memory_margin) divides the memory limit by ``1 + margin``:
    a plan fits only if its peak that much larger does."""
    changes: dict[str, dict] = {"compute": {}, "runtime": {}, "intra": {}, "inter": {}}
    for name, value in values.items():
        p = parameter(name)
        changes[p.where][p.field] = float(value)
    if not any(changes.values()) and not memory_margin:
        return problem
    cluster = problem.cluster
    if changes["intra"] or changes["inter"]:
        cluster = _cluster_with(cluster, changes["intra"], changes["inter"])
    return dataclasses.replace(problem, cluster=cluster,
                               runtime=_replaced(problem.runtime, changes["runtime"]),
                               compute=_replaced(problem.compute, changes["compute"]),
                               mem_limit_bytes=problem.mem_limit_bytes / (1 + memory_margin))
