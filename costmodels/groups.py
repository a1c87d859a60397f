"""Plans whose pipeline stages run on different node groups (a heterogeneous cluster).

Every stage runs on one group (``Stage.group``), with the same TP/DP/CP degrees everywhere:
its layers compute on that group's GPU with that GPU's compute profile, its TP and DP
collectives use the group's links (a stage's DP ring lives in its group), and its memory is
held against its own limit (the user's, capped at the group GPU's memory; the allowances are
the same). Sends between consecutive stages of one group use that group's pipeline links;
between two groups, the slower side's inter-node link. The step is
    pipeline(per-stage micro-batch times) + the worst stage's exposed DP reduction and
    optimizer step
(1F1B, one chunk per rank). :func:`stage_cost` is what both :func:`estimate_on_groups` and the
heterogeneous search (``autoplan.search.hetero``) evaluate, so the two agree to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.topology import GroupLinks, group_links
from autoplan.costmodels.compute import Split
from autoplan.costmodels.fp8 import best_gemm_peak
from autoplan.costmodels.memory import in_flight_chunks, model_state_bytes
from autoplan.costmodels.pipeline import pipeline_time
from autoplan.costmodels.placement import axis_stride, plan_links
from autoplan.costmodels.problem import MIB, Problem, memo, memory_mib
from autoplan.costmodels.ranks import (
    RankCost, chunk_compositions, chunk_sums, held_params, other_bytes, pp_comm, stage_tensors,
)
from autoplan.costmodels.summary import summarize
from autoplan.costmodels.sync import dp_time, offload_param_time, optimizer_time
from autoplan.errors import ConstraintError
from autoplan.plan import Estimate, Plan
from autoplan.units import GIB


@dataclass(frozen=True, slots=True)
class StageCost:
    """One stage's micro-batch cost and memory on its group, and what it adds after the
    pipeline drains (its DP reduction and optimizer step)."""

    cost: RankCost
    sync_s: float
    optimizer_s: float
    limit_bytes: float

    @property
    def after_s(self) -> float:
        return self.sync_s + self.optimizer_s

    @property
    def headroom_mib(self) -> int:
        """Whole MiB left under the stage's limit (negative: over it); the search's unit."""
        return int(self.limit_bytes // MIB) - memory_mib(self.cost.memory)

    @property
    def fits(self) -> bool:
        return self.headroom_mib >= 0


def _within_links(problem: Problem, plan: Plan, group: str, stages: int) -> GroupLinks:
    """Pipeline links between consecutive stages of one group (``stages`` of them)."""
    key = ("pp_within", group, stages, axis_stride(plan, "pp"))
    links = memo(problem).get(key)
    if links is None:
        links = memo(problem)[key] = group_links(problem.on_group(group).cluster, stages,
                                                  axis_stride(plan, "pp"))
    return links


def _across_links(problem: Problem, group: str) -> GroupLinks:
    """A send from one of ``group``'s nodes to another node, over its own NICs."""
    key = ("pp_across", group)
    links = memo(problem).get(key)
    if links is None:
        cluster = problem.on_group(group).cluster
        links = memo(problem)[key] = group_links(cluster, 2, cluster.gpus_per_node)
    return links


def _pp_time(problem: Problem, plan: Plan, rank: int, groups: tuple[str, ...],
             stage: tuple[int, int]) -> float:
    """Activation and gradient sends of a stage per micro-batch over the slowest link to its
    neighbours: its group's pipeline links, or across groups the slower side's network."""
    group, times = groups[rank], [0.0]
    sub = problem.on_group(group)
    for neighbour in (rank - 1, rank + 1):
        if not 0 <= neighbour < len(groups):
            continue
        if groups[neighbour] == group:
            links = _within_links(problem, plan, group, groups.count(group))
            times.append(pp_comm(sub, plan, (stage,), links))
        else:
            for side in (group, groups[neighbour]):
                times.append(pp_comm(problem.on_group(side), plan, (stage,),
                                      _across_links(problem, side)))
    return max(times)


def stage_cost(problem: Problem, plan: Plan, rank: int, groups: tuple[str, ...],
               stage: tuple[int, int]) -> StageCost:
    """Cost of pipeline rank ``rank`` running layers ``stage = (first, num)`` on node group
    ``groups[rank]``, with the other ranks on ``groups``; ``plan`` supplies the degrees and
    switches (its own stages are not read)."""
    base = _stage_base(problem, plan, rank, groups, stage)
    sums, params, states = base.sums, base.params, base.states
    held = in_flight_chunks(rank, pp=plan.pp, vpp=1, num_microbatches=plan.num_microbatches)
    activations = held * sums.acts_per_chunk + sums.working
    sub = problem.on_group(groups[rank])
    split = Split.of(plan, problem.flash_attention, problem.runtime)
    other, excess = other_bytes(sub, plan, activations, sums.largest, params, base.trained,
                                tensors=stage_tensors(sub, plan, (stage,), split),
                                states=states.total)
    cost = RankCost(rank, sums.compute_s + sums.tp_comm_s + sums.cp_comm_s + base.pp_s,
                     sums.compute_s, sums.backward_s, sums.tp_comm_s, sums.cp_comm_s,
                     sums.wgrad_s, base.pp_s, states, activations, other, params,
                     sums.acts_per_chunk, sums.largest, sums.gathers, trained=base.trained,
                     reserved_excess=excess)
    return StageCost(cost, base.sync_s, base.optimizer_s, sub.mem_limit_bytes)


@dataclass(frozen=True, slots=True)
class _StageBase:
    """What a stage costs whatever its position's micro-batches in flight."""

    sums: object
    pp_s: float
    params: float
    states: object
    sync_s: float
    optimizer_s: float
    trained: float


def _settings_key(plan: Plan) -> tuple:
    return (plan.tp, plan.pp, plan.dp, plan.cp, plan.micro_batch_size, plan.num_microbatches,
            plan.sequence_parallel, plan.zero_stage, plan.recompute, plan.recompute_num_layers,
            plan.offload)


def _neighbours(groups: tuple[str, ...], rank: int) -> tuple:
    """What a stage's pipeline links depend on: its group, how many stages that group runs
    when a neighbour shares it, and the groups of the other neighbours."""
    group = groups[rank]
    near = [groups[n] for n in (rank - 1, rank + 1) if 0 <= n < len(groups)]
    return (group, groups.count(group) if group in near else 0,
            tuple(sorted(g for g in near if g != group)))


def _stage_base(problem: Problem, plan: Plan, rank: int, groups: tuple[str, ...],
                stage: tuple[int, int]) -> _StageBase:
    """Cached per (group, layer classes, ends, neighbours, switches): equal stages of one group
    at different positions share it."""
    sub = problem.on_group(groups[rank])
    compositions = chunk_compositions(sub, plan, (stage,))
    first, num = stage
    ends = (sub.layer_counts(first, 1), sub.layer_counts(first + num - 1, 1))
    key = ("stage", compositions, ends, _neighbours(groups, rank), _settings_key(plan))
    base = memo(problem).get(key)
    if base is not None:
        return base
    split = Split.of(plan, problem.flash_attention, problem.runtime)
    links = plan_links(sub, plan)
    sums = chunk_sums(sub, compositions, split, links["tp"], links["cp"])
    pp_s = _pp_time(problem, plan, rank, groups, stage) if plan.pp > 1 else 0.0
    held = held_params(problem, plan, sums, (stage,))
    params = held.count
    states = model_state_bytes(params, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp,
                               offload=plan.offload, runtime=problem.runtime,
                               trained=held.trained, weight_bytes=held.weight_bytes,
                               optimizer=problem.training.optimizer)
    sync_s = dp_time(sub, plan, params, links["dp"], backward_s=sums.backward_s,
                      compute_s=plan.num_microbatches * sums.compute_s, gathers=sums.gathers,
                      trained=held.trained)
    optimizer_s = (optimizer_time(sub, plan, held.trained)
                   + offload_param_time(sub, plan, params))
    base = memo(problem)[key] = _StageBase(sums, pp_s, params, states, sync_s, optimizer_s,
                                              held.trained)
    return base


def step_time(micro_batch_s: list[float], after_s: list[float], num_microbatches: int) -> float:
    """The step from the stages' micro-batch times (pipeline order) and what each adds after
    the pipeline drains; the search computes its candidates' steps with this same function."""
    return pipeline_time(slowest_s=max(micro_batch_s), total_s=sum(micro_batch_s),
                         num_microbatches=num_microbatches, vpp=1) + max(after_s)


def check_groups(problem: Problem, plan: Plan) -> None:
    """Refuse a plan whose stages name unknown groups or need more GPUs than a group has."""
    groups = plan.stage_groups
    known = {g.name: g for g in problem.cluster.groups}
    for name in dict.fromkeys(groups):
        if name not in known:
            raise ConstraintError(
                f"the plan puts stages on node group {name!r} but the cluster's groups are "
                f"{', '.join(known) or 'none'}; name one of them in each stage's group.")
        need = groups.count(name) * plan.tp * plan.dp * plan.cp
        if need > known[name].num_gpus:
            raise ConstraintError(
                f"the plan puts {groups.count(name)} stages of tp*dp*cp = "
                f"{plan.tp * plan.dp * plan.cp} GPUs on group {name!r}, {need} GPUs, but it has "
                f"{known[name].num_gpus}; move stages to other groups or lower tp*dp.")


def on_groups_in_order(problem: Problem, plan: Plan) -> Plan:
    """A plan without node groups (pins, an imported configuration) placed on a heterogeneous
    cluster: its stages fill the groups in cluster.yaml order, as many as each group's GPUs
    hold, keeping the plan's layer split.

    Raises:
        ConstraintError: the stages need more GPUs than the groups hold, or vpp > 1.
    """
    if plan.vpp > 1:
        raise ConstraintError(
            f"vpp = {plan.vpp}: stages on the node groups of a heterogeneous cluster run one "
            "chunk per pipeline rank; use vpp 1.")
    per_stage = plan.tp * plan.dp * plan.cp
    groups: list[str] = []
    for group in problem.cluster.groups:
        groups += [group.name] * min(group.num_gpus // per_stage, plan.pp - len(groups))
    if len(groups) < plan.pp:
        raise ConstraintError(
            f"the plan's {plan.pp} stages of tp*dp*cp = {per_stage} GPUs do not fit the node "
            f"groups ({', '.join(f'{g.name}: {g.num_gpus} GPUs' for g in problem.cluster.groups)}) "
            "one stage inside one group; lower tp*dp or pp.")
    stages = tuple(s.model_copy(update={"group": g}) for s, g in zip(plan.stages, groups))
    return plan.model_copy(update={"stages": stages})


def stage_costs(problem: Problem, plan: Plan) -> list[StageCost]:
    groups = plan.stage_groups
    return [stage_cost(problem, plan, rank, groups, stage) for rank, stage in enumerate(plan.layout)]


def tightest(costs: list[StageCost]) -> StageCost:
    """The stage with the least headroom under its own limit (the first of equals)."""
    return min(costs, key=lambda c: c.headroom_mib)


def estimate_on_groups(problem: Problem, plan: Plan) -> Estimate:
    """estimate() of a plan whose stages name node groups."""
    costs = stage_costs(problem, plan)
    m = plan.num_microbatches
    times = [c.cost.micro_batch_s for c in costs]
    step = step_time(times, [c.after_s for c in costs], m)
    slow = max(costs, key=lambda c: c.cost.micro_batch_s).cost
    sync = max(costs, key=lambda c: c.after_s)
    worst = tightest(costs)
    est = summarize(problem, plan, step=step, worst=worst.cost,
                     memories=[c.cost.memory for c in costs], breakdown={
        "compute": m * slow.compute_s, "tp_comm": m * slow.tp_comm_s,
        "pp_comm": m * slow.pp_comm_s, "dp_comm": sync.sync_s,
        "bubble": step - sync.after_s - m * slow.micro_batch_s, "optimizer": sync.optimizer_s,
    })
    peak = sum(best_gemm_peak(problem.on_group(g).cluster.gpu, problem.precision)
               for g in plan.stage_groups) / plan.pp
    return est.model_copy(update={
        "mfu": est.model_tflops_per_gpu * 1e12 / peak,
        "memory_limit_gib": worst.limit_bytes / GIB,
        "feasible": all(c.cost.memory <= c.limit_bytes for c in costs),
        "stage_memory_limit_gib": tuple(c.limit_bytes / GIB for c in costs),
    })


def step_and_peak_on_groups(problem: Problem, plan: Plan) -> tuple[float, float]:
    costs = stage_costs(problem, plan)
    step = step_time([c.cost.micro_batch_s for c in costs], [c.after_s for c in costs],
                     plan.num_microbatches)
    return step, tightest(costs).cost.memory
