"""``autoplan verify`` of a plan document: the plan, its sequence length and cluster read from
``solve --json`` (or a bare Plan), the fp32 memory prediction each rank is compared with, and
the runner started (autoplan.verify.runner)."""

from __future__ import annotations

from pathlib import Path

from autoplan.cluster.loaded import load_cluster
from autoplan.costmodels.problem import Problem
from autoplan.costmodels.profiles import compute_profile
from autoplan.errors import ConstraintError
from autoplan.graph.model import load_model
from autoplan.graph.sandbox import DEFAULT_TIME_LIMIT_S as DEFAULT_TRACE_TIME_LIMIT_S
from autoplan.plan import Plan, Result
from autoplan.report import load_result
from autoplan.training import AttentionKernel, TrainingSpec
from autoplan.verify.memory import FP32_ADAM, predicted_rank_bytes
from autoplan.verify.runner import verify_plan
from autoplan.verify.tp_check import local_tp_problem

CPU_STAND_IN = {"gpu": "a100-sxm4-80gb", "nodes": 1,
                "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"}}
"""The cluster a bare Plan's memory is predicted on (one node of as many GPUs as ranks)."""


def verify_result(model: str | Path, plan_or_result: Plan | Result | str | Path, *,
                  steps: int = 5, seq_len: int | None = None,
                  trace_time_limit_s: float | None = None) -> dict:
    """Train the plan on CPU ranks next to a single-process reference (see
    :func:`autoplan.api.verify`)."""
    if isinstance(plan_or_result, (str, Path)):
        plan_or_result = load_result(plan_or_result)
    result = plan_or_result if isinstance(plan_or_result, Result) else None
    plan = result.plan if result else plan_or_result
    if seq_len is None:
        if result is None or (result.training is None and result.model is None):
            raise ConstraintError("verify needs seq_len for a bare Plan; pass seq_len=.")
        seq_len = result.training.seq_len if result.training else result.model.seq_len
    if not isinstance(model, (str, Path)):
        raise ConstraintError("verify needs the path of model.py: every rank imports it.")
    if plan.stage_groups is not None:
        raise ConstraintError(
            "verify runs a plan on one kind of CPU rank; this plan puts its stages on node "
            "groups of a heterogeneous cluster. Verify its layer split with `autoplan export "
            "--target torchrun` on the cluster, or solve for one group to verify here.")
    loaded = load_model(model, trace_time_limit_s=trace_time_limit_s or DEFAULT_TRACE_TIME_LIMIT_S)
    cluster = load_cluster(result.cluster if result and result.cluster else {
        **CPU_STAND_IN, "gpus_per_node": plan.world_size})
    training = TrainingSpec(seq_len=seq_len, global_batch=plan.global_batch_size,
                            attention=AttentionKernel.EXPLICIT)
    problem = Problem(graph=loaded.trace(seq_len, "fp32"), cluster=cluster.cluster,
                      training=training, runtime=FP32_ADAM,
                      compute=compute_profile(cluster.cluster.gpu.name),
                      mem_limit_bytes=cluster.cluster.gpu.memory_bytes)
    notes = []
    if plan.tp > 1:
        problem_line = local_tp_problem(loaded.source, problem.graph, plan.tp)
        if problem_line:
            notes.append(problem_line)
    return verify_plan(str(model), plan, seq_len=seq_len, steps=steps,
                       predicted_bytes=predicted_rank_bytes(problem, plan), notes=notes)
