"""The plan a set of pins means when nothing is searched (``estimate``): the documented
defaults for every unpinned dimension, the runtime's implied switches, and the check that a
saved plan belongs to the traced model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from autoplan.capabilities import RUNTIMES
from autoplan.costmodels.groups import check_groups, on_groups_in_order
from autoplan.costmodels.problem import Problem
from autoplan.degrees import of_plan, plan_fields
from autoplan.errors import ConstraintError
from autoplan.options import as_pins
from autoplan.plan import ModelInfo, Plan
from autoplan.plugins.importers import ImportedRun
from autoplan.search.space import (
    balanced_stages, check_ep, check_ep_cluster, check_pins, check_tp, dp_options,
    pipeline_schedule,
)
from autoplan.training import DEFAULT_PLACEMENT, Pins

if TYPE_CHECKING:
    from autoplan.graph.model import Model


def plan_from_pins(problem: Problem, pins: Pins, *, first: int | None = None,
                   last: int | None = None) -> Plan:
    """A fully pinned plan; unpinned dimensions take the defaults tp=pp=cp=1, dp = the largest
    degree that divides the global batch and fits the remaining GPUs, mbs=1, ZeRO-0, no
    recompute, no SP, no interleaving, no offload, balanced stages."""
    world = problem.cluster.num_gpus
    tp, pp, cp = pins.tp or 1, pins.pp or 1, pins.cp or 1
    mbs, vpp = pins.mbs or 1, pins.vpp or 1
    batch = problem.training.global_batch
    fitting = dp_options(batch, world // (tp * pp * cp), pins.dp)
    dp = fitting[-1] if fitting else pins.dp or 0
    if not dp or tp * pp * dp * cp > world or batch % (dp * mbs):
        raise ConstraintError(
            f"the plan tp={tp} pp={pp} dp={dp or '?'} cp={cp} mbs={mbs} does not fit {world} "
            f"GPUs and a global batch of {batch}: tp*pp*dp*cp must not exceed the GPU count and "
            "the global batch must divide by dp*mbs.")
    ep = pins.ep or 1
    if (dp * cp) % ep:
        raise ConstraintError(
            f"--ep {ep} does not divide dp*cp = {dp * cp} (dp={dp} cp={cp}): expert-parallel "
            "ranks are carved out of the data-parallel replicas. Pin a --dp that --ep divides.")
    caps = RUNTIMES[problem.training.runtime]
    sp = pins.sp if pins.sp is not None else tp > 1 and (  # Megatron needs SP with EP and TP
        ep > 1 and caps.ep_with_tp_needs_sp or caps.tp_implies_sp)
    return Plan(
        **plan_fields(
            tp=tp, pp=pp, dp=dp, cp=cp, zero=pins.zero or 0, mbs=mbs,
            recompute=pins.recompute or ("full" if pins.recompute_num_layers else "none"),
            recompute_num_layers=pins.recompute_num_layers, sp=bool(sp), vpp=vpp,
            offload=pins.offload or "none", placement=pins.placement or DEFAULT_PLACEMENT, ep=ep),
        global_batch_size=batch, num_microbatches=batch // (dp * mbs), world_size=tp * pp * dp * cp,
        stages=balanced_stages(problem.graph, pp, vpp, first=first, last=last),
        pipeline_schedule=pipeline_schedule(problem.training.runtime, vpp),
    )


def check_plan_matches(problem: Problem, plan: Plan, model: Model,
                       info: ModelInfo | None = None) -> None:
    """Refuse a plan made for another model: its stages must cover the traced layers and the
    model section of its JSON (``info``, when there is one) must count the same parameters.

    Raises:
        ConstraintError: saying what differs.
    """
    graph = problem.graph
    if info is not None and info.num_params != graph.num_params:
        raise ConstraintError(
            f"the plan was made for {info.name} ({info.num_params:,} parameters) but "
            f"{model.name} has {graph.num_params:,}: the plan does not match the model. Pass "
            "the model.py it was solved for, or solve this model afresh.")
    if plan.num_layers != len(graph.layers):
        raise ConstraintError(
            f"the plan's stages cover {plan.num_layers} layers but {model.name} traces into "
            f"{len(problem.graph.layers)} (embedding, blocks, head and loss each count): the "
            "plan does not match the model (was it made for another model?). Pass the "
            "model.py it was solved for, or solve this model afresh.")


def with_implied_sp(problem: Problem, plan: Plan) -> Plan:
    """The plan as its runtime runs it: torchtitan shards the sequence whenever TP > 1."""
    if plan.tp > 1 and not plan.sequence_parallel and RUNTIMES[problem.training.runtime].tp_implies_sp:
        return plan.model_copy(update={"sequence_parallel": True})
    return plan


def plan_for(problem: Problem, model: Model, plan_or_pins: Plan | Mapping[str, Any] | Pins
             | ImportedRun | None) -> Plan:
    """The plan to estimate: a Plan checked against the problem, or pins (from the caller or an
    imported configuration) completed with the documented defaults."""
    cluster = problem.cluster
    if isinstance(plan_or_pins, Plan):
        return _checked_plan(problem, model, plan_or_pins)
    run = plan_or_pins if isinstance(plan_or_pins, ImportedRun) else None
    pins = as_pins(run.pins if run else plan_or_pins)
    check_ep_cluster(cluster, pins.ep)
    check_pins(problem.graph, world=cluster.num_gpus, training=problem.training, pins=pins)
    plan = plan_from_pins(problem, pins, first=run.first_stage_blocks if run else None,
                          last=run.last_stage_blocks if run else None)
    return plan if cluster.is_homogeneous else on_groups_in_order(problem, plan)


def _checked_plan(problem: Problem, model: Model, plan: Plan) -> Plan:
    """A given plan checked against the traced model and the cluster, with the switches its
    runtime implies, laid on the node groups in order where it names none."""
    cluster = problem.cluster
    check_plan_matches(problem, plan, model)
    check_tp(problem.graph, plan.tp, world=cluster.num_gpus)
    if plan.world_size > cluster.num_gpus:
        raise ConstraintError(f"the plan needs {plan.world_size} GPUs but the "
                              f"cluster has {cluster.num_gpus}.")
    if plan.ep > 1:
        check_ep_cluster(cluster, plan.ep)
        check_ep(problem.graph, problem.training, Pins(**of_plan(plan, ("ep", "dp", "cp", "tp", "sp"))))
    plan = with_implied_sp(problem, plan)
    if plan.stage_groups is not None:
        check_groups(problem, plan)
    elif not cluster.is_homogeneous:
        return on_groups_in_order(problem, plan)
    return plan
