"""One estimate() for everything: the step time and per-GPU memory of a plan.

The solver tabulates it, ``autoplan estimate`` prints it and the brute-force reference enumerates
it, so all three agree by construction. The step is
    pipeline(per-rank micro-batch times) + exposed data-parallel reduction + optimizer step
where a rank's micro-batch time is its layers' compute (compute.py), their exposed TP
collectives and its pipeline sends (comm.py); memory is model states plus in-flight
activations plus a stated allowance (memory.py) on the worst rank. Plans whose stages run on
different node groups of a heterogeneous cluster are costed stage by stage (groups.py).

The parts live by concept: the problem and its memo (problem.py), where groups lie and their
links (placement.py), one layer's costs (layers.py), one rank's (ranks.py), what the step adds
after the micro-batches (sync.py), FLOPs (flops.py), lower bounds for the search (bounds.py)
and the reported Estimate (summary.py); this module puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.costmodels.compute import Split
from autoplan.costmodels.groups import estimate_on_groups, step_and_peak_on_groups
from autoplan.costmodels.pipeline import pipeline_time
from autoplan.costmodels.placement import plan_links
from autoplan.costmodels.problem import Problem, memo
from autoplan.costmodels.profiles import reduces_every_microbatch
from autoplan.costmodels.ranks import (
    RankCost,
    activation_peak,
    chunk_memories,
    other_bytes,
    rank_activations,
    rank_base,
    rank_cost,
    rank_groups,
    rank_signature,
    rank_stages,
    stage_tensors,
    step_transients,
)
from autoplan.costmodels.step_allocations import step_segments
from autoplan.costmodels.summary import summarize
from autoplan.costmodels.sync import dp_time, least_dp_time, offload_param_time, optimizer_time

from autoplan.plan import Estimate, PipelineSchedule, Plan


def _deferred_share(plan: Plan, costs: list[RankCost]) -> float:
    """Share of the slowest rank's micro-batch that a zero-bubble schedule defers into the
    bubble: its weight-gradient GEMMs (0 for the default schedules)."""
    if plan.pipeline_schedule is not PipelineSchedule.ZERO_BUBBLE:
        return 0.0
    slow = max(costs, key=lambda c: c.micro_batch_s)
    return slow.wgrad_s / slow.micro_batch_s if slow.micro_batch_s else 0.0


@dataclass(frozen=True, slots=True)
class _Evaluation:
    """What estimate() and the solver's tables share: the step and each rank group's cost."""

    step_s: float
    pipeline_s: float
    dp_s: float
    optimizer_s: float
    groups: list[list[int]]
    costs: list[RankCost]

    @property
    def slowest(self) -> RankCost:
        return max(self.costs, key=lambda c: c.micro_batch_s)

    @property
    def peak_memory_bytes(self) -> float:
        """The first rank of each group holds the most micro-batches in flight."""
        return max(c.memory for c in self.costs)


@dataclass(frozen=True, slots=True)
class _RankCosts:
    """The plan's links and each rank group's cost: its memory, and what its step adds up."""

    links: dict
    groups: list[list[int]]
    costs: list[RankCost]


def _rank_costs(problem: Problem, plan: Plan) -> _RankCosts:
    """Each rank group's cost, kept for the last plan: the search prices a plan's memory first
    and its step time (or a bound over its splits, ``split_floor_s``) from the same ranks."""
    last = memo(problem).get("last_rank_costs")
    if last is None or last[0] != plan:
        links = plan_links(problem, plan)
        groups = rank_groups(problem, plan)
        costs = [_chunks_rank_cost(problem, plan, ranks[0], links) for ranks in groups]
        last = memo(problem)["last_rank_costs"] = plan, _RankCosts(links, groups, costs)
    return last[1]


def _chunks_rank_cost(problem: Problem, plan: Plan, rank: int, links: dict) -> RankCost:
    """``rank_cost`` of the rank running its chunks of the plan, kept per problem by what it
    depends on (the plan's degrees and switches, the rank, and its ``rank_signature``): the
    splits the partition model re-evaluates differ in a few ranks' counts, and permutations
    of interchangeable stages give each rank a count another split gave it."""
    key = ("chunks_rank_cost", tuple(getattr(plan, name) for name in _PLAN_BUT_STAGES), rank,
           rank_signature(problem, plan, rank))
    cost = memo(problem).get(key)
    if cost is None:
        cost = memo(problem)[key] = rank_cost(problem, plan, rank, links)
    return cost


_PLAN_BUT_STAGES = tuple(name for name in Plan.model_fields if name != "stages")
"""Every field of a plan but its stages: what a rank's cost reads besides its chunks."""


def _evaluate(problem: Problem, plan: Plan) -> _Evaluation:
    ranks = _rank_costs(problem, plan)
    links, groups, costs = ranks.links, ranks.groups, ranks.costs
    slowest = max(c.micro_batch_s for c in costs)
    total = sum(c.micro_batch_s * len(ranks) for ranks, c in zip(groups, costs))
    m = plan.num_microbatches
    pipe = pipeline_time(slowest_s=slowest, total_s=total, num_microbatches=m, vpp=plan.vpp,
                         deferred_share=_deferred_share(plan, costs))
    params = max(c.params for c in costs)
    trained = max(c.trained for c in costs)
    experts = max(c.expert_params for c in costs)
    slow = max(costs, key=lambda c: c.micro_batch_s)
    dp_s = dp_time(problem, plan, params, links["dp"], backward_s=slow.backward_s,
                    compute_s=m * slow.compute_s, gathers=slow.gathers,
                    experts=(experts, links["expert_dp"]) if experts else None, trained=trained)
    opt_s = (optimizer_time(problem, plan, trained, experts)
             + offload_param_time(problem, plan, params))
    return _Evaluation(pipe + dp_s + opt_s, pipe, dp_s, opt_s, groups, costs)


@dataclass(frozen=True, slots=True)
class RankProfile:
    """One pipeline rank's share of a step: what the partition model tabulates."""

    micro_batch_s: float
    after_s: float
    """Its gradient reduction and optimizer step, as if it were the plan's slowest rank."""
    memory_bytes: float


def rank_profile(problem: Problem, plan: Plan, rank: int,
                 chunks: tuple[tuple[int, int], ...]) -> RankProfile:
    """Costs of pipeline rank ``rank`` running ``chunks``, its ``(first, num)`` layers of each
    model chunk, under the plan's degrees and switches (``plan``'s own stages are not read):
    the terms ``_evaluate`` takes the max or sum of over ranks."""
    links = plan_links(problem, plan)
    cost = _stage_rank_cost(problem, plan, rank, chunks)
    experts = cost.expert_params
    sync_s = dp_time(problem, plan, cost.params, links["dp"], backward_s=cost.backward_s,
                     compute_s=plan.num_microbatches * cost.compute_s, gathers=cost.gathers,
                     experts=(experts, links["expert_dp"]) if experts else None,
                     trained=cost.trained)
    optimizer_s = (optimizer_time(problem, plan, cost.trained, experts)
                   + offload_param_time(problem, plan, cost.params))
    return RankProfile(cost.micro_batch_s, sync_s + optimizer_s, cost.memory)


def rank_memory_bytes(problem: Problem, plan: Plan, rank: int,
                      chunks: tuple[tuple[int, int], ...]) -> float:
    """``rank_profile``'s memory alone: the partition screens a stage's memory before its
    times, which a stage over the limit does not need."""
    return _stage_rank_cost(problem, plan, rank, chunks).memory


def _stage_rank_cost(problem: Problem, plan: Plan, rank: int,
                     chunks: tuple[tuple[int, int], ...]) -> RankCost:
    """``rank_cost`` of a rank running ``chunks``, kept per problem (its memory is asked for
    first, its times where it fits)."""
    key = ("stage_rank_cost", plan, rank, chunks)
    cost = memo(problem).get(key)
    if cost is None:
        cost = memo(problem)[key] = rank_cost(problem, plan, rank, plan_links(problem, plan),
                                              chunks)
    return cost


def split_floor_s(problem: Problem, plan: Plan) -> float:
    """A step time no split of the blocks over ``plan``'s pipeline ranks beats under its
    degrees and switches, for blocks all alike (``plan``'s own stages balanced, as
    ``space.balanced_stages`` cuts them: each rank runs at most ceil(B/p) blocks).

    The ranks' micro-batch times sum to the same S whatever the split (alike blocks; the ends
    and each chunk's sends fixed), so the slowest takes T >= S/p and the schedule m T +
    (S - T)/v (1F1B at v = 1: (m - 1) T + S), which grows with T. Some rank of any split runs
    at least ceil(B/p) blocks, so its largest parameter count is at least the least of the
    balanced ranks' (trained ones likewise), and what follows the drain is at least
    ``least_dp_time`` of those, under a window of T (the slowest rank's backward and forward
    are within its micro-batch), plus their optimizer step and offload. Below ZeRO-3 that
    floor falls by at most 1 s per second T grows, so with m >= 2 the sum is least at
    T = S/p; with ZeRO-3 or m = 1 the window is left unbounded. EP-split experts: the
    pipeline term alone."""
    evaluation = _rank_costs(problem, plan)
    total = sum(c.micro_batch_s * len(ranks)
                for ranks, c in zip(evaluation.groups, evaluation.costs))
    m = plan.num_microbatches
    slowest = total / plan.pp
    pipe = pipeline_time(slowest_s=slowest, total_s=total, num_microbatches=m, vpp=plan.vpp)
    if any(c.expert_params for c in evaluation.costs):
        return pipe
    params = min(c.params for c in evaluation.costs)
    trained = min(c.trained for c in evaluation.costs)
    window = slowest if m >= 2 and plan.zero_stage < 3 else None
    after = (least_dp_time(problem, plan, params, trained, plan_links(problem, plan)["dp"],
                           window)
             + optimizer_time(problem, plan, trained) + offload_param_time(problem, plan, params))
    return pipe + after


def _evaluated(problem: Problem, plan: Plan) -> tuple[float, float]:
    """``_evaluate`` as ``step_and_peak``, kept for every plan."""
    evaluation = _evaluate(problem, plan)
    found = memo(problem)[("step_and_peak", plan)] = (evaluation.step_s,
                                                       evaluation.peak_memory_bytes)
    return found


def step_and_peak(problem: Problem, plan: Plan) -> tuple[float, float]:
    """(step seconds, worst-GPU bytes): exactly what estimate() reports, without the detail,
    for the solver's tables."""
    if plan.stage_groups is not None:
        return step_and_peak_on_groups(problem, plan)
    found = memo(problem).get(("step_and_peak", plan))  # a plan met again (a ZeRO re-solve,
    return found or _evaluated(problem, plan)  # a runner-up) is free


def worst_gpu_bytes(problem: Problem, plan: Plan) -> float:
    """``step_and_peak``'s worst-GPU bytes without its step time: the ranks' costs alone, none
    of the pipeline, gradient reduction and optimizer terms. Most plans a search meets do
    not fit, and those need no step time (``search.table`` prices it where asked)."""
    if plan.stage_groups is not None:
        return step_and_peak_on_groups(problem, plan)[1]
    found = memo(problem).get(("step_and_peak", plan))
    if found is not None:
        return found[1]
    key = ("peak", plan)
    peak = memo(problem).get(key)
    if peak is None:
        peak = memo(problem)[key] = max(c.memory for c in _rank_costs(problem, plan).costs)
    return peak


def _rank_memories(problem: Problem, plan: Plan, evaluation: _Evaluation) -> list[float]:
    """Memory of every rank: within a group only the chunk-micro-batches in flight differ."""
    memories = [0.0] * plan.pp
    split = Split.of(plan, problem.flash_attention, problem.runtime)
    links = plan_links(problem, plan)
    for ranks, cost in zip(evaluation.groups, evaluation.costs):
        for rank in ranks:
            stages = rank_stages(plan, rank)
            sums, _, _ = rank_base(problem, plan, rank, split, links)
            activations = (cost.activations if rank == cost.rank else
                           rank_activations(problem, plan, rank, stages, split, links, sums))
            other, _ = other_bytes(problem, plan, activations, cost.largest, cost.params,
                                   cost.trained, tensors=stage_tensors(problem, plan, stages, split),
                                   states=cost.states.total)
            memories[rank] = cost.states.total + activations + other
    return memories


def peak_moments(problem: Problem, plan: Plan) -> list[str]:
    """For each pipeline rank, the moment of the step that sets its memory peak: the
    chunk-micro-batches it holds in flight (its schedule's warm-up, pipeline.in_flight_moments)
    when its largest transient runs, the cross-entropy of the logits or the backward of its
    heaviest layer (a full-recompute block rebuilding its activations), with ZeRO-3's gathered
    copies held meanwhile; or the gradient reduction and optimizer step, when their transients
    outweigh those or take new segments of the caching allocator
    (step_allocations.step_segments)."""
    moments = [""] * plan.pp
    links = plan_links(problem, plan)
    split = Split.of(plan, problem.flash_attention, problem.runtime)
    for ranks in rank_groups(problem, plan):
        for rank in ranks:
            sums, _, holds = rank_base(problem, plan, rank, split, links)
            stages = rank_stages(plan, rank)
            peak = activation_peak(problem, plan, rank,
                                   chunk_memories(problem, plan, stages, split, links), sums)
            if peak.accumulating:
                copied = ("the 16-bit gradients of the whole stage, before they are added "
                          "into the fp32 buffer," if problem.runtime.grads_before_accumulation_bytes
                          else "the copy of the largest gradient as it is accumulated")
                moments[rank] = (f"{copied} after a micro-batch's backward, with {peak.held} "
                                 "other micro-batch chunk(s) in flight")
                continue
            layers, output = stage_tensors(problem, plan, stages, split)
            segments = step_segments(layers, output=output,
                                     num_microbatches=plan.num_microbatches,
                                     step_transients=step_transients(problem, plan, sums.largest,
                                                                     holds.count, holds.trained))
            if segments.new or segments.least > peak.bytes:
                moments[rank] = ("the gradient reduction and optimizer step (copies of the "
                                 "gradients that no block the backward left cached can hold "
                                 "take new segments), after every micro-batch's activations "
                                 "are freed")
                continue
            kind = peak.working_kind
            what = ("the loss (cross-entropy over the logits) of the newest micro-batch"
                    if kind == "loss" else f"the backward of a {kind}" if kind else "the backward")
            if kind != "loss" and reduces_every_microbatch(problem.runtime, plan.zero_stage):
                what += " beside the unsharded gradients queued for its reduce-scatters"
            moments[rank] = f"{what}, with {peak.held} micro-batch chunk(s) of activations in flight"
    return moments


def estimate(problem: Problem, plan: Plan) -> Estimate:
    """Predicted step time and worst-GPU memory of ``plan`` on ``problem``."""
    if plan.stage_groups is not None:
        return estimate_on_groups(problem, plan)
    evaluation = _evaluate(problem, plan)
    slow, m = evaluation.slowest, plan.num_microbatches
    worst = max(evaluation.costs, key=lambda c: c.memory)
    breakdown = {"compute": m * slow.compute_s, "tp_comm": m * slow.tp_comm_s}
    if plan.cp > 1:  # the ring-attention transfers; absent without CP
        breakdown["cp_comm"] = m * slow.cp_comm_s
    if plan.ep > 1:  # the expert-parallel all-to-alls; absent without EP
        breakdown["ep_comm"] = m * slow.ep_comm_s
    breakdown |= {"pp_comm": m * slow.pp_comm_s, "dp_comm": evaluation.dp_s,
                  "bubble": evaluation.pipeline_s - m * slow.micro_batch_s,
                  "optimizer": evaluation.optimizer_s}
    return summarize(problem, plan, step=evaluation.step_s, worst=worst,
                      memories=_rank_memories(problem, plan, evaluation), breakdown=breakdown)
