"""What a step adds after its micro-batches: the exposed data-parallel reduction (and ZeRO-3
gathers), the optimizer step, and parameter offload's host copies."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from itertools import accumulate, islice

from autoplan.costmodels import comm
from autoplan.costmodels.compute import unshard_copy_time
from autoplan.costmodels.memory import (
    WEIGHT_BYTES,
    optimizer_step_bytes,
)
from autoplan.costmodels.problem import Problem, memo
from autoplan.costmodels.profiles import pipeline_resident, reduces_every_microbatch

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

SHARD_GRAD_OP_PASSES = 2
"""FSDP1 SHARD_GRAD_OP collectives per unit and micro-batch: one all-gather for the forward
(the unit stays gathered through its backward) and one reduce-scatter of its gradients."""


def zero3_calls(runtime, params: float, trained: float, units: int) -> int:
    """ZeRO-3 collectives one micro-batch issues over the GPU's ``params`` parameters
    (``trained`` of them with gradients) in ``units`` gather units.

    Without prefetch settings, one all-gather per unit in the forward and in the backward and
    one reduce-scatter per unit (FSDP: per wrapped block). DeepSpeed's coordinator
    (partitioned_param_coordinator.py fetch_sub_module) all-gathers, per module fetch, what
    is not yet in flight in one all_gather_coalesced and then prefetches the next
    ``min(stage3_prefetch_bucket_size, stage3_max_live_parameters - available)`` elements of
    the step's trace in one more, whole parameters until it has at least that many. Until the
    live limit binds, each call takes at least a bucket: the first ``min(params, max live)``
    elements in about ``ceil(that / prefetch bucket)`` calls; beyond it, each module released
    frees room for about one module: the rest one call per module (never more calls than
    modules). stage3.py reduce-scatters the gradients one reduce_bucket_size bucket at a
    time (reduce_independent_p_g_buckets_and_remove_grads)."""
    if not runtime.zero3_prefetch_bucket_params:
        return ZERO3_PASSES * units
    window = min(params, runtime.zero3_max_live_params)
    past_window = round(units * (params - window) / params) if params else 0
    gathers = min(units, math.ceil(window / runtime.zero3_prefetch_bucket_params) + past_window)
    reduces = min(units, math.ceil(trained / runtime.reduce_bucket_params))
    return 2 * gathers + reduces


def dp_time(problem: Problem, plan: Plan, params: float, links: GroupLinks,
             backward_s: float, compute_s: float, gathers: int = 0,
             experts: tuple[float, GroupLinks] | None = None,
             trained: float | None = None) -> float:
    """Exposed gradient reduction (and ZeRO gathers) per step for one GPU's parameters.

    Gradient reduction can overlap the last micro-batch's backward (``backward_s``): a
    runtime's ``dp_overlap`` share of it, or, with ``overlap_grad_reduce``, the bucket
    schedule of :func:`_bucketed_dp_time` (``compute_s`` then gives the forward that hides
    the parameter all-gathers); ZeRO-3
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
    if reduces_every_microbatch(runtime, plan.zero_stage) and _bucketed(runtime, plan):
        forward_s = compute_s / plan.num_microbatches - backward_s
        units = max(gathers, 1)
        key = ("per_microbatch_dp", plan.num_microbatches, units,
               tuple((t, l) for _, t, l in groups), backward_s, forward_s)
        cached = memo(problem).get(key)
        if cached is None:
            cached = memo(problem)[key] = _per_microbatch_dp_time(
                problem, plan, groups, backward_s, forward_s, trained / units)
        return cached
    if plan.zero_stage < 3 and _bucketed(runtime, plan):
        forward_s = compute_s / plan.num_microbatches - backward_s
        key = ("bucketed_dp", plan.vpp, plan.pp, plan.zero_stage,
               tuple((t, l) for _, t, l in groups), backward_s, forward_s)
        cached = memo(problem).get(key)
        if cached is None:
            cached = memo(problem)[key] = _bucketed_dp_time(problem, plan, groups, backward_s,
                                                            forward_s)
        return cached
    if pipeline_resident(runtime, plan.zero_stage, plan.pp):
        forward_s = compute_s / plan.num_microbatches - backward_s
        return sum(_resident_zero3_time(problem, plan, p, t, l, gathers, forward_s)
                   for p, t, l in groups)
    sync = sum(_dp_collectives(problem, plan, p, t, l, gathers) for p, t, l in groups)
    if plan.zero_stage < 3 and not _gathers_per_microbatch(runtime, plan):
        return _overlapped(sync, backward_s, runtime.dp_overlap)
    copies = unshard_copy_time(params, runtime.unshard_copy_bytes, problem.cluster.gpu,
                               problem.compute)
    return plan.num_microbatches * copies + _overlapped(plan.num_microbatches * sync, compute_s,
                                                        runtime.zero3_overlap)


def _resident_zero3_time(problem: Problem, plan: Plan, params: float, trained: float,
                         links: GroupLinks, units: int, forward_s: float) -> float:
    """Exposed seconds of a pipeline-resident ZeRO-3 step (``profiles.pipeline_resident``) over
    ``links``: one all-gather of the stage's weights, under the first micro-batch's forward
    (``forward_s``) as FSDP prefetches unit after unit, and one reduce-scatter of its
    gradients after the last backward, which nothing hides; each of the ``units`` gather
    units' two collectives pays the ring latency; and the copies on the compute stream
    (:func:`resident_copy_bytes`)."""
    runtime = problem.runtime
    latency = units * comm.ring_latency(links)
    reduce_bytes = runtime.reduce_bytes or runtime.grad_bytes
    gather = (comm.all_gather_time(WEIGHT_BYTES * params, links)
              / runtime.zero3_collective_efficiency + latency)
    reduce = (comm.reduce_scatter_time(reduce_bytes * trained, links)
              / runtime.zero3_collective_efficiency + latency)
    gathered, accumulated = resident_copy_bytes(reduce_bytes, plan.num_microbatches)
    gpu, profile = problem.cluster.gpu, problem.compute
    copies = (unshard_copy_time(params, gathered, gpu, profile)
              + unshard_copy_time(trained, accumulated, gpu, profile))
    return copies + _overlapped(gather, forward_s, runtime.zero3_overlap) + reduce


def resident_copy_bytes(reduce_bytes: float, microbatches: int) -> tuple[float, float]:
    """HBM bytes per parameter (gathered, trained) a pipeline-resident FSDP2 step moves on the
    compute stream (torch/distributed/fsdp/_fully_shard/_fsdp_param.py and
    _fsdp_collectives.py): the all-gather copy-out into the unsharded parameter once (read 2,
    write 2); the first micro-batch's gradient cast to the reduce dtype
    (``to_accumulated_grad_if_needed``: read 2, write ``reduce_bytes``; none when it is the
    parameters' 2 bytes) and each later one's ``unsharded_accumulated_grad += grad`` (read
    both, write the accumulator); the reduce-scatter copy-in of the accumulated gradient
    (read and write ``reduce_bytes``)."""
    first = WEIGHT_BYTES + reduce_bytes if reduce_bytes != WEIGHT_BYTES else 0.0
    accumulate = (microbatches - 1) * (2 * reduce_bytes + WEIGHT_BYTES)
    return 2 * WEIGHT_BYTES, first + accumulate + 2 * reduce_bytes


def least_dp_time(problem: Problem, plan: Plan, params: float, trained: float,
                  links: GroupLinks, window_s: float | None) -> float:
    """A floor under ``dp_time`` for a GPU holding at least ``params`` parameters (``trained``
    of them trained, no EP-split experts) whose backward and forward per micro-batch each take
    at most ``window_s`` (None: any length), for the search's bounds over stage splits.

    Each term only grows with the parameters (collective and copy times grow with their bytes,
    bucket counts with the parameters) and only shrinks as the compute that hides it grows:
    bucket by bucket (``_bucketed_dp_time``) the reductions run one after another, so at least
    their sum less the backward window is exposed (the parameter gathers, at least 0, are left
    out); otherwise ``_overlapped`` under the window (ZeRO-3: under the m micro-batches'
    compute, at most m windows), with ZeRO-3 gathers' latency left out. The floor falls by at
    most 1 per second the window grows below ZeRO-3 (m times ``zero3_overlap`` with it)."""
    if plan.dp * plan.cp == 1:
        return 0.0
    runtime = problem.runtime
    window = float("inf") if window_s is None else window_s
    if reduces_every_microbatch(runtime, plan.zero_stage) and _bucketed(runtime, plan):
        # the last micro-batch's reductions are all ready within its backward; one collective
        # over them all costs no more than the units' one by one
        grads = (runtime.reduce_bytes or runtime.grad_bytes) * trained
        return max(0.0, comm.reduce_scatter_time(grads, links) - window)
    if plan.zero_stage < 3 and _bucketed(runtime, plan):
        grad_bytes = runtime.reduce_bytes or runtime.grad_bytes
        reduce = comm.all_reduce_time if plan.zero_stage == 0 else comm.reduce_scatter_time
        sizes = _buckets(runtime, plan, trained / plan.vpp, links.size, grad_bytes)
        priced = {size: reduce(grad_bytes * size, links) for size in set(sizes)}
        end = ((plan.vpp - 1) * plan.pp + 1) * window / plan.vpp
        return max(0.0, plan.vpp * sum(priced[size] for size in sizes) - end)
    if pipeline_resident(runtime, plan.zero_stage, plan.pp):
        return _resident_zero3_time(problem, plan, params, trained, links, 0, window)
    sync = _dp_collectives(problem, plan, params, trained, links, gathers=0)
    if plan.zero_stage < 3 and not _gathers_per_microbatch(runtime, plan):
        return _overlapped(sync, window, runtime.dp_overlap)
    m = plan.num_microbatches
    copies = unshard_copy_time(params, runtime.unshard_copy_bytes, problem.cluster.gpu,
                               problem.compute)
    return m * copies + _overlapped(m * sync, m * window, runtime.zero3_overlap)


def grad_bucket_params(runtime, dp_size: int) -> float:
    """Parameters per gradient bucket: megatron-core's default ``max(40M, 1M * dp size)``
    (DistributedDataParallelConfig.bucket_size; larger DP groups get larger buckets so each
    rank's ring chunk stays large)."""
    return max(runtime.grad_bucket_params, runtime.grad_bucket_params_per_rank * dp_size)


def bucket_sizes(params: float, bucket: float, first: float | None = None) -> list[float]:
    """``params`` cut into buckets of ``bucket`` in backward order, the first of ``first``
    (DDP's smaller first bucket) where given; the last (the first layers, the embedding)
    holds the remainder."""
    if params <= 0:
        return []
    head = [] if first is None else [min(first, params)]
    params -= sum(head)
    full = int(params // bucket)
    rest = params - full * bucket
    return head + [bucket] * full + ([rest] if rest > 0 else [])


def _gathers_per_microbatch(runtime, plan: Plan) -> bool:
    """Whether the runtime's ZeRO-2 gathers and reduces per unit every micro-batch (FSDP1
    SHARD_GRAD_OP), priced and overlapped as ZeRO-3 is."""
    return plan.zero_stage == 2 and runtime.zero2_gathers_per_microbatch


def _bucketed(runtime, plan: Plan) -> bool:
    """Whether the gradient reduction runs bucket by bucket under the backward: Megatron
    with --overlap-grad-reduce, or DDP (a runtime's ZeRO 0 with DDP buckets)."""
    return runtime.overlap_grad_reduce or (plan.zero_stage == 0 and runtime.ddp_bucket_bytes > 0)


def _buckets(runtime, plan: Plan, params: float, dp_size: int, grad_bytes: float) -> list[float]:
    """One model chunk's gradient buckets (parameters each), in the runtime's sizes."""
    if plan.zero_stage == 0 and runtime.ddp_bucket_bytes:
        return bucket_sizes(params, runtime.ddp_bucket_bytes / grad_bytes,
                            runtime.ddp_first_bucket_bytes / grad_bytes)
    return bucket_sizes(params, grad_bucket_params(runtime, dp_size))


def filled_at(sizes: list[float], start_s: float, span_s: float) -> list[float]:
    """When each bucket's gradients are all there, for buckets filled in order by a backward
    running from ``start_s`` for ``span_s`` at an even rate per parameter."""
    total = sum(sizes)
    return [start_s + span_s * done / total for done in accumulate(sizes)]


def reduced_as_ready(ready_s: list[float], times: list[float], end_s: float) -> float:
    """Exposed seconds of per-bucket reductions, each launched when its bucket is ready
    (``ready_s``, in launch order) and run one after another on one communication stream:
    what is still running at ``end_s``, when the backward ends. The last bucket is ready only
    at the end, so its whole reduction is exposed."""
    done = 0.0
    for ready, seconds in zip(ready_s, times):
        if ready > done:  # max(done, ready), without a call per bucket
            done = ready
        done += seconds
    return max(0.0, done - end_s) if times else 0.0


def begun_at(sizes: list[float], start_s: float, span_s: float) -> list[float]:
    """When the layers of each bucket start, for buckets used in order by a forward running
    from ``start_s`` for ``span_s`` at an even rate per parameter."""
    total = sum(sizes)
    return [ready - span_s * size / total
            for ready, size in zip(filled_at(sizes, start_s, span_s), sizes)]


def gathered_ahead(needed_s: list[float], times: list[float]) -> float:
    """Exposed seconds of per-bucket parameter all-gathers issued back to back from the start
    of the step's forward, each waited for when its layers start (``needed_s``; megatron-core's
    --overlap-param-gather prefetches them in order): the longest wait, at least the first
    bucket's gather."""
    done, wait = 0.0, 0.0
    for needed, seconds in zip(needed_s, times):
        done += seconds
        if done - needed > wait:  # max(wait, done - needed), without a call per bucket
            wait = done - needed
    return wait


@dataclass(frozen=True, slots=True)
class _ChunkBuckets:
    """One group's gradient buckets of one model chunk, priced: the same in every chunk, so
    worked out once per schedule. ``filled`` and ``begun`` are :func:`filled_at` and
    :func:`begun_at` less their start (each chunk adds its own start, in the same floating
    point operations); ``begun`` is None when nothing waits for the gathers."""

    reduce_s: list[float]
    gather_s: list[float]
    filled: list[float]
    begun: list[tuple[float, float]] | None


def _chunk_buckets(problem: Problem, plan: Plan, trained: float, links: GroupLinks,
                   span_s: float, forward_span_s: float, grad_bytes: float) -> _ChunkBuckets:
    """The buckets of ``trained / vpp`` parameters over ``links``, each priced once per size
    and problem (a model's buckets are all one size but the first and last)."""
    runtime = problem.runtime
    sizes = _buckets(runtime, plan, trained / plan.vpp, links.size, grad_bytes)
    reduce = comm.all_reduce_time if plan.zero_stage == 0 else comm.reduce_scatter_time
    priced = {size: _price(problem, reduce, grad_bytes * size, links) for size in set(sizes)}
    total = sum(sizes)
    filled = [span_s * done / total for done in accumulate(sizes)]
    gather_s, begun = [], None
    if plan.zero_stage:
        backward_order = sizes[::-1]
        gathered = {size: _price(problem, comm.all_gather_time, WEIGHT_BYTES * size, links)
                    for size in priced}
        gather_s = [gathered[size] for size in backward_order]
        if runtime.overlap_param_gather:
            total = sum(backward_order)
            begun = [(forward_span_s * done / total, forward_span_s * size / total)
                     for done, size in zip(accumulate(backward_order), backward_order)]
    return _ChunkBuckets([priced[size] for size in sizes], gather_s, filled, begun)


def _price(problem: Problem, collective, nbytes: float, links: GroupLinks) -> float:
    """``collective(nbytes, links)``, remembered per problem."""
    key = ("bucket_price", collective.__name__, nbytes, links)
    found = memo(problem).get(key)
    if found is None:
        found = memo(problem)[key] = collective(nbytes, links)
    return found


def _bucketed_dp_time(problem: Problem, plan: Plan, groups: list, backward_s: float,
                      forward_s: float) -> float:
    """Megatron's --overlap-grad-reduce (megatron-core DistributedDataParallel), and DDP's
    Reducer, which schedules its buckets the same way: each bucket's
    all-reduce (reduce-scatter with the distributed optimizer) starts once the last
    micro-batch's backward has produced its gradients (the earlier micro-batches run under
    no_sync). Each model chunk has its own buckets: with interleaving (VPP v) the chunks
    finish their last backward one after another in the cool-down, ``pp`` chunk-backwards
    apart (the schedule runs pp micro-batches per chunk), so a chunk's reduction can run
    under the backwards of the chunks after it. With the distributed optimizer the updated
    parameters are all-gathered bucket by bucket, under the next step's first forward with
    --overlap-param-gather (``overlap_param_gather``), else after the step."""
    runtime = problem.runtime
    grad_bytes = runtime.reduce_bytes or runtime.grad_bytes
    chunk_s = backward_s / plan.vpp  # one chunk's backward of one micro-batch
    forward_chunk_s = forward_s / plan.vpp
    chunks = [_chunk_buckets(problem, plan, trained, links, chunk_s, forward_chunk_s,
                             grad_bytes) for _, trained, links in groups]
    ready, reduce_s, needed, gather_s = [], [], [], []
    for chunk in range(plan.vpp):
        start = chunk * plan.pp * chunk_s
        # the forward runs the chunks in the opposite order, each pp micro-batches long
        forward_start = (plan.vpp - 1 - chunk) * plan.pp * forward_chunk_s
        for buckets in chunks:
            ready += [start + filled for filled in buckets.filled]
            reduce_s += buckets.reduce_s
            gather_s += buckets.gather_s
            if buckets.begun is not None:
                needed += [forward_start + filled - size for filled, size in buckets.begun]
    end = ((plan.vpp - 1) * plan.pp + 1) * chunk_s
    exposed = reduced_as_ready(*_in_order(ready, reduce_s), end)
    if gather_s and runtime.overlap_param_gather:
        return exposed + gathered_ahead(*_in_order(needed, gather_s))
    return exposed + sum(gather_s)


def _per_microbatch_dp_time(problem: Problem, plan: Plan, groups: list, backward_s: float,
                            forward_s: float, unit: float) -> float:
    """Megatron-FSDP's ZeRO-2 (``optim_grads``) with --overlap-grad-reduce: each micro-batch's
    backward reduce-scatters its gradients one FSDP unit (``unit`` parameters, a block) at a
    time on one side stream, each launched once the backward has filled it; the backwards are
    a forward apart (1F1B's steady state), so a reduction still running goes on under the
    next forward, and what runs past the last backward is exposed. The updated parameters
    are all-gathered unit by unit after the step, under the next step's first forward with
    --overlap-param-gather (``overlap_param_gather``), else exposed."""
    runtime = problem.runtime
    grad_bytes = runtime.reduce_bytes or runtime.grad_bytes
    period = forward_s + backward_s
    ready, reduce_s, needed, gather_s = [], [], [], []
    for _, trained, links in groups:
        sizes = bucket_sizes(trained, unit)
        reduced = {size: _price(problem, comm.reduce_scatter_time, grad_bytes * size, links)
                   for size in set(sizes)}
        filled = filled_at(sizes, 0.0, backward_s)
        for micro_batch in range(plan.num_microbatches):
            ready += [micro_batch * period + done for done in filled]
            reduce_s += [reduced[size] for size in sizes]
        forward_order = sizes[::-1]
        gather_s += [_price(problem, comm.all_gather_time, WEIGHT_BYTES * size, links)
                     for size in forward_order]
        needed += begun_at(forward_order, 0.0, forward_s)
    end = (plan.num_microbatches - 1) * period + backward_s
    exposed = reduced_as_ready(*_in_order(ready, reduce_s), end)
    if runtime.overlap_param_gather:
        return exposed + gathered_ahead(*_in_order(needed, gather_s))
    return exposed + sum(gather_s)


def _in_order(times: list[float], costs: list[float]) -> tuple[list[float], list[float]]:
    """Both lists sorted by ``times`` (the order the collectives are issued in; most often
    they already are: the chunks' buckets fill one chunk after another)."""
    if all(map(operator.le, times, islice(times, 1, None))):
        return times, costs
    order = sorted(range(len(times)), key=times.__getitem__)
    return [times[i] for i in order], [costs[i] for i in order]


def bucketed_reduction(runtime, reduce, trained: float, grad_bytes: float,
                       links: GroupLinks) -> float:
    """Seconds of ``reduce`` over ``grad_bytes`` of ``trained`` parameters' gradients, cut
    into the runtime's reduce buckets (``reduce_bucket_params`` elements each, DeepSpeed's
    reduce_bucket_size): one collective, and its latency, per bucket; one in all without."""
    if not runtime.reduce_bucket_params or trained <= 0:
        return reduce(grad_bytes, links)
    buckets = math.ceil(trained / runtime.reduce_bucket_params)
    return buckets * reduce(grad_bytes / buckets, links)


def _dp_collectives(problem: Problem, plan: Plan, params: float, trained: float,
                    links: GroupLinks, gathers: int) -> float:
    """Seconds of the data-parallel collectives over ``links`` for ``params`` parameters,
    ``trained`` of them with gradients: per step below ZeRO-3, per micro-batch with ZeRO-3."""
    runtime = problem.runtime
    grads = (runtime.reduce_bytes or runtime.grad_bytes) * trained
    if plan.zero_stage == 0:
        return bucketed_reduction(runtime, comm.all_reduce_time, trained, grads, links)
    if reduces_every_microbatch(runtime, plan.zero_stage):
        return (plan.num_microbatches * comm.reduce_scatter_time(grads, links)
                + comm.all_gather_time(WEIGHT_BYTES * trained, links))
    if _gathers_per_microbatch(runtime, plan):
        volume = (comm.all_gather_time(WEIGHT_BYTES * params, links)
                  + comm.reduce_scatter_time(grads, links))
        latency = SHARD_GRAD_OP_PASSES * gathers * comm.ring_latency(links)
        return volume / runtime.zero3_collective_efficiency + latency
    if plan.zero_stage < 3:
        reduce = (comm.all_reduce_time if runtime.zero_grads_all_reduced
                  else comm.reduce_scatter_time)
        return (bucketed_reduction(runtime, reduce, trained, grads, links)
                + comm.all_gather_time(WEIGHT_BYTES * trained, links))
    weights = WEIGHT_BYTES * params
    volume = 2 * comm.all_gather_time(weights, links) + comm.reduce_scatter_time(grads, links)
    latency = zero3_calls(runtime, params, trained, gathers) * comm.ring_latency(links)
    return volume / runtime.zero3_collective_efficiency + latency


COMPOSER_STEP_OPS = (
    ("exp_avg.mul_(beta1)", 1, 1),
    ("exp_avg.add_(grad, alpha=1 - beta1)", 2, 1),
    ("exp_avg_sq.mul_(beta2)", 1, 1),
    ("exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)", 3, 1),
    ("exp_avg_sq.sqrt()", 1, 1),
    ("/ math.sqrt(bias_correction2)", 1, 1),
    (".add_(eps)", 1, 1),
    ("param.addcdiv_(exp_avg, denom, value=-step_size)", 3, 1),
    ("vector_norm(grad)", 1, 0),
    ("grad.mul_(clip_coef_clamped)", 1, 1),
)
"""(operation, tensors read, tensors written) per parameter of the step llm-foundry's runs
take, one elementwise kernel each over the GPU's shard: Composer's DecoupledAdamW.adamw
(composer/optim/decoupled_weight_decay.py, composer@02c872e: a Python loop over the
parameters, in-place ops, no foreach or fused kernel; ``param.mul_`` for the weight decay is
skipped at llm-foundry's ``weight_decay: 0.0``, scripts/train/yamls/pretrain/mpt-*.yaml),
after Composer's gradient_clipping algorithm (``clipping_type: norm`` in the same yamls), which
calls FSDP1's clip_grad_norm_: one vector_norm read per gradient, then each gradient scaled in
place (torch/distributed/fsdp/fully_sharded_data_parallel.py). addcmul_ loads ``grad`` as
both of its operands."""


def per_op_bytes(ops, element_bytes: float) -> float:
    """HBM bytes per element of ``ops`` (``(name, reads, writes)``), each its own kernel that
    reads and writes whole tensors of ``element_bytes`` per element."""
    return element_bytes * sum(reads + writes for _, reads, writes in ops)


def _step_traffic_bytes(problem: Problem) -> float:
    """HBM bytes per trained parameter of the optimizer step: the runtime's per-op figure, or
    one fused pass over master, states, the 16-bit weight and the gradient."""
    runtime = problem.runtime
    if runtime.optimizer_step_traffic_bytes:
        return runtime.optimizer_step_traffic_bytes
    return optimizer_step_bytes(problem.training.optimizer, runtime) + runtime.grad_bytes


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
    traffic = shard * _step_traffic_bytes(problem)
    gpu = problem.cluster.gpu
    return traffic / (gpu.memory_bandwidth_Bps * problem.compute.memory_efficiency)


def offload_param_time(problem: Problem, plan: Plan, params: float) -> float:
    """ZeRO-3 parameter offload fetches the weights over PCIe for every forward and backward."""
    if plan.offload is not Offload.PARAMS:
        return 0.0
    return plan.num_microbatches * 2 * WEIGHT_BYTES * params / _host_link(problem)
