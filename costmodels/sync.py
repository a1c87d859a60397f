"""What a step adds after its micro-batches: the exposed data-parallel reduction (and ZeRO-3
gathers), the optimizer step, and parameter offload's host copies."""

from __future__ import annotations

from autoplan.costmodels import comm
from autoplan.costmodels.compute import unshard_copy_time
from autoplan.costmodels.memory import (
    WEIGHT_BYTES,
    optimizer_step_bytes,
)
from autoplan.costmodels.problem import Problem

from autoplan.cluster.topology import GroupLinks
from autoplan.plan import Offload, Plan

HOST_LINK_BPS = 25e9
"""[Empirical] achieved PCIe 4.0 x16 host<->GPU copy bandwidth (of 31.5 GB/s) for offload, when
cluster.yaml states no ``host_bandwidth``."""


CPU_ADAM_PARAMS_PER_S = 1.0e9
"""[Empirical] DeepSpeed CPUAdam throughput per GPU's share of a host (ZeRO-Offload, Ren et al.
2021, reports ~1B parameters/s on a 2-socket server)."""


def _overlapped(comm_s: float, compute_s: float, overlap: float) -> float:
    """Exposed part of communication that can run under ``compute_s`` of computation, when a
    fraction ``overlap`` of the shorter of the two is hidden."""
    return comm_s - overlap * min(comm_s, compute_s)


ZERO3_PASSES = 3
"""ZeRO-3 collectives per gather unit and micro-batch: the weights are gathered for the forward
and again for the backward (with its recompute), and the gradients reduce-scattered (3x the
model bytes, Rajbhandari et al. 2020)."""


def dp_time(problem: Problem, plan: Plan, params: float, links: GroupLinks,
             backward_s: float, compute_s: float, gathers: int = 0,
             experts: tuple[float, GroupLinks] | None = None,
             trained: float | None = None) -> float:
    """Exposed gradient reduction (and ZeRO gathers) per step for one GPU's parameters.

    Gradient reduction can overlap the last micro-batch's backward (``backward_s``); ZeRO-3
    parameter gathers and reduce-scatters run every micro-batch and can overlap all compute.
    ZeRO-3 issues them per gather unit (``gathers`` per pass over the GPU's layers), each a
    ring over the DP group that pays its latency (:func:`comm.ring_latency`). ``experts``:
    EP-split expert parameters (part of ``params``) and their expert-data-parallel group,
    which reduces them instead of the whole DP group, in the same overlap window. Only the
    ``trained`` parameters (default: all) have gradients to reduce and weights to re-gather
    after the step; ZeRO-3 gathers every weight, and where the runtime copies gathered
    parameters and gradients on the compute stream (FSDP2) those copies add, unhidden.
    """
    if plan.dp * plan.cp == 1:
        return 0.0
    runtime = problem.runtime
    trained = params if trained is None else trained
    groups = [(params, trained, links)]
    if experts is not None and experts[0]:
        groups = [(params - experts[0], trained - experts[0], links),
                  (experts[0], experts[0], experts[1])]
    sync = sum(_dp_collectives(problem, plan, p, t, l, gathers) for p, t, l in groups)
    if plan.zero_stage < 3:
        return _overlapped(sync, backward_s, runtime.dp_overlap)
    copies = unshard_copy_time(params, runtime.unshard_copy_bytes, problem.cluster.gpu,
                               problem.compute)
    return plan.num_microbatches * copies + _overlapped(plan.num_microbatches * sync, compute_s,
                                                        runtime.zero3_overlap)


def _dp_collectives(problem: Problem, plan: Plan, params: float, trained: float,
                    links: GroupLinks, gathers: int) -> float:
    """Seconds of the data-parallel collectives over ``links`` for ``params`` parameters,
    ``trained`` of them with gradients: per step below ZeRO-3, per micro-batch with ZeRO-3."""
    runtime = problem.runtime
    grads = (runtime.reduce_bytes or runtime.grad_bytes) * trained
    if plan.zero_stage == 0:
        return comm.all_reduce_time(grads, links)
    if plan.zero_stage < 3:
        return (comm.reduce_scatter_time(grads, links)
                + comm.all_gather_time(WEIGHT_BYTES * trained, links))
    weights = WEIGHT_BYTES * params
    volume = 2 * comm.all_gather_time(weights, links) + comm.reduce_scatter_time(grads, links)
    latency = ZERO3_PASSES * gathers * comm.ring_latency(links)
    return volume / runtime.zero3_collective_efficiency + latency


def _host_link(problem: Problem) -> float:
    return problem.cluster.host_bandwidth_Bps or HOST_LINK_BPS


def optimizer_time(problem: Problem, plan: Plan, params: float, experts: float = 0.0) -> float:
    """Optimizer step over the GPU's shard of its ``params`` trained parameters: memory-bound
    on the GPU, or CPUAdam plus PCIe copies. ``experts``: EP-split expert parameters among
    ``params``, sharded over dp*cp/ep ranks."""
    shard = params / (plan.dp * plan.cp if plan.zero_stage >= 1 else 1)
    if experts and plan.zero_stage >= 1:
        shard += experts * (plan.ep - 1) / (plan.dp * plan.cp)
    if plan.offload is not Offload.NONE:
        copies = shard * (problem.runtime.grad_bytes + WEIGHT_BYTES) / _host_link(problem)
        return shard / CPU_ADAM_PARAMS_PER_S + copies
    traffic = shard * (optimizer_step_bytes(problem.training.optimizer, problem.runtime)
                       + problem.runtime.grad_bytes)
    gpu = problem.cluster.gpu
    return traffic / (gpu.memory_bandwidth_Bps * problem.compute.memory_efficiency)


def offload_param_time(problem: Problem, plan: Plan, params: float) -> float:
    """ZeRO-3 parameter offload fetches the weights over PCIe for every forward and backward."""
    if plan.offload is not Offload.PARAMS:
        return 0.0
    return plan.num_microbatches * 2 * WEIGHT_BYTES * params / _host_link(problem)
