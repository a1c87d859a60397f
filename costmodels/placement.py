"""Where a plan's groups lie on the cluster: the rank stride of each axis under the plan's
placement, and the links of its TP, CP, PP, gradient-reduction and expert groups."""

from __future__ import annotations

from autoplan.costmodels.problem import Problem, memo

from autoplan.cluster.spec import Cluster
from autoplan.cluster.topology import GroupLinks, group_links
from autoplan.plan import Plan


def axis_stride(plan: Plan, axis: str) -> int:
    """Rank distance between neighbours of the plan's group along ``axis``: the product of the
    sizes of the axes placed inside it (placement lists the innermost axis first)."""
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    order = plan.placement.split("-")
    stride = 1
    for name in order[: order.index(axis)]:
        stride *= sizes[name]
    return stride


def axis_links(cluster: Cluster, plan: Plan, axis: str) -> GroupLinks:
    """The links of the plan's group along ``axis`` on ``cluster``."""
    return group_links(cluster, getattr(plan, axis), axis_stride(plan, axis))


def plan_axis_links(problem: Problem, plan: Plan, axis: str) -> GroupLinks:
    """axis_links(), cached per problem (the solver asks for the same groups many times)."""
    key = ("links", getattr(plan, axis), axis_stride(plan, axis))
    links = memo(problem).get(key)
    if links is None:
        links = memo(problem)[key] = axis_links(problem.cluster, plan, axis)
    return links


def _replica_links(problem: Problem, plan: Plan) -> GroupLinks:
    """The group that reduces gradients and shards ZeRO states: DP and CP ranks hold the same
    weights, so it spans dp*cp GPUs (Megatron's data-parallel group with CP, torchtitan's
    dp_shard_cp mesh); with the axes adjacent it starts at the inner one's stride."""
    if plan.cp == 1:
        return plan_axis_links(problem, plan, "dp")
    return _cached_links(problem, plan.dp * plan.cp, _replica_stride(plan))


def _replica_stride(plan: Plan) -> int:
    """Rank distance between neighbouring replicas (DP or CP ranks, whichever is inner)."""
    if plan.cp == 1:
        return axis_stride(plan, "dp")
    return min(axis_stride(plan, "cp"), axis_stride(plan, "dp"))


def _cached_links(problem: Problem, size: int, stride: int) -> GroupLinks:
    key = ("links", "replicas", size, stride)
    links = memo(problem).get(key)
    if links is None:
        links = memo(problem)[key] = group_links(problem.cluster, size, stride)
    return links


def _expert_links(problem: Problem, plan: Plan) -> tuple[GroupLinks, GroupLinks]:
    """(EP group, expert-data-parallel group): EP takes the innermost ``ep`` of the dp*cp
    replicas (Megatron's order tp-cp-ep-dp-pp), and the ``dp*cp/ep`` ranks holding the same
    experts, ``ep`` replicas apart, reduce and shard their gradients and states."""
    stride = _replica_stride(plan)
    return (_cached_links(problem, plan.ep, stride),
            _cached_links(problem, plan.dp * plan.cp // plan.ep, stride * plan.ep))


def plan_links(problem: Problem, plan: Plan) -> dict[str, GroupLinks]:
    """The links of each of the plan's groups; "dp" is the gradient-reduction group."""
    links = {axis: plan_axis_links(problem, plan, axis) for axis in ("tp", "cp", "pp")}
    links["dp"] = _replica_links(problem, plan)
    if plan.ep > 1:
        links["ep"], links["expert_dp"] = _expert_links(problem, plan)
    return links
