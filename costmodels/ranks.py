"""A pipeline rank's costs: the layers of its chunks summed, its pipeline sends, the parameters
and model states it holds, the memory besides them, and which ranks cost the same."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from operator import mul

from autoplan.costmodels import comm, tp_overlap
from autoplan.costmodels.compute import Split
from autoplan.costmodels.experts import ep_comm_time, expert_params, routing_time
from autoplan.costmodels.fp8 import weights_cached_beside
from autoplan.costmodels.host import layer_host_delay_s
from autoplan.costmodels.layers import layer_cost, layer_memory_bytes, logits_layer
from autoplan.costmodels.memory import (
    WEIGHT_BYTES,
    ModelStates,
    cublas_workspace_bytes,
    ddp_bucket_copy_bytes,
    grad_norm_copy_bytes,
    held_fp32_logits_bytes,
    layer_tensor_shapes,
    flat_grad_copy_excess_bytes,
    grad_copy_bytes_per_element,
    in_backward_grads_held,
    in_flight_chunks,
    last_stage_output_slots,
    model_state_bytes,
    nvls_buffer_bytes,
    reduce_queue_bytes,
    reduction_copy_bytes,
    upcast_grad_moment_bytes,
    zero3_buffer_bytes,
)
from autoplan.costmodels.pipeline import (
    blocking_transfers,
    in_flight_moments,
    partition_gathers,
    partition_meta_bytes,
)
from autoplan.costmodels.placement import plan_links
from autoplan.costmodels.problem import Problem, memo
from autoplan.costmodels.profiles import pipeline_resident, reduces_every_microbatch
from autoplan.costmodels.step_allocations import (
    LayerTensors,
    StageOutput,
    StepSegments,
    step_segments,
    tensors_of,
)

from autoplan.cluster.topology import GroupLinks
from autoplan.graph.layer_graph import LayerKind
from autoplan.plan import Plan, Recompute


@dataclass(frozen=True, slots=True)
class RankCost:
    rank: int
    micro_batch_s: float
    compute_s: float
    backward_s: float
    tp_comm_s: float
    cp_comm_s: float
    wgrad_s: float
    pp_comm_s: float
    states: ModelStates
    activations: float
    other: float
    params: float
    acts_per_chunk: float
    largest: float
    gathers: int
    ep_comm_s: float = 0.0  # expert-parallel all-to-alls per micro-batch
    expert_params: float = 0.0
    """The part of ``params`` that are experts split by EP (0 when ep = 1: experts are then
    sharded and reduced like every other parameter)."""
    trained: float = 0.0  # of params, those that require grad: reduced and stepped
    reserved_excess: float = 0.0
    """Of ``other``, what the caching allocator reserves beyond its allocated peak
    (allocator_excess_bytes)."""

    @property
    def memory(self) -> float:
        return self.states.total + self.activations + self.other


def rank_stages(plan: Plan, rank: int) -> tuple[tuple[int, int], ...]:
    """The model chunks ``(first_layer, num_layers)`` a pipeline rank runs (chunk c is virtual
    stage c*pp + rank)."""
    layout = plan.layout
    return tuple(layout[c * plan.pp + rank] for c in range(plan.vpp))


@dataclass(frozen=True, slots=True)
class ChunkSums:
    """Per-micro-batch sums over the layers of a rank's chunks."""

    compute_s: float
    backward_s: float
    tp_comm_s: float
    cp_comm_s: float
    wgrad_s: float
    params: float
    acts_per_chunk: float
    working: float
    largest: float
    gathers: int
    trained: float
    weight_bytes: float
    working_kind: str = ""  # the kind of layer whose backward (or loss) holds ``working``
    fp8_workspace_bytes: float = 0.0  # TE's cached FP8 weights (costmodels.fp8)
    backward_working: float = 0.0
    """The largest transient of a layer's backward, the loss's apart (the loss runs before
    the backward, when no gradient is held yet)."""
    backward_kind: str = ""  # the kind of layer that holds ``backward_working``


def chunk_compositions(problem: Problem, plan: Plan,
                        stages: tuple[tuple[int, int], ...]) -> tuple:
    """Each chunk as ``((class id, how many, recompute), ...)``.

    With ``recompute_num_layers = N`` a chunk's layers up to its N-th block are fully
    recomputed and the rest keep their activations (Megatron's ``--recompute-method block``:
    the first N transformer layers of every model chunk); layers that are not blocks cost the
    same either way.
    """
    n = plan.recompute_num_layers if plan.recompute is Recompute.FULL else None
    key = ("compositions", stages, plan.recompute, n)
    found = memo(problem).get(key)
    if found is not None:  # asked for by each rank group, its experts and its signature
        return found
    chunks = []
    for first, num in stages:
        cut = num if n is None else recomputed_prefix(problem, first, num, n)
        rest = Recompute.NONE if n is not None else plan.recompute
        chunks.append(tuple((c, k, plan.recompute) for c, k in problem.layer_counts(first, cut))
                      + tuple((c, k, rest) for c, k in problem.layer_counts(first + cut, num - cut)))
    found = memo(problem)[key] = tuple(chunks)
    return found


def recomputed_prefix(problem: Problem, first: int, num: int, n: int) -> int:
    """Layers of the chunk ``layers[first:first+num]`` up to and including its n-th block."""
    key = ("prefix", first, num, n)
    cut = memo(problem).get(key)
    if cut is None:
        blocks = [i for i in range(first, first + num)
                  if problem.graph.layers[i].kind is LayerKind.BLOCK]
        cut = memo(problem)[key] = num if len(blocks) <= n else blocks[n - 1] + 1 - first
    return cut


def chunk_sums(problem: Problem, compositions: tuple, split: Split,
                tp_links: GroupLinks, cp_links: GroupLinks) -> ChunkSums:
    key = ("sums", compositions, split, tp_links, cp_links)
    cached = memo(problem).get(key)
    if cached is not None:
        return cached
    compute_s = backward_s = tp_comm_s = cp_comm_s = wgrad_s = params = acts = working = 0.0
    largest = trained = weight_bytes = fp8_workspace = backward_working = 0.0
    gathers = 0
    working_kind = backward_kind = ""
    for composition in compositions:
        for class_id, count, recompute in composition:
            layer = problem.layer_class(class_id)
            cost = layer_cost(problem, layer, class_id, split, recompute, tp_links, cp_links)
            compute_s += count * (cost.compute_s + layer_host_delay_s(
                problem.runtime, layer, split, recompute,
                cost.compute_s + cost.tp_comm_s + cost.cp_comm_s))
            backward_s += count * cost.backward_s
            tp_comm_s += count * cost.tp_comm_s
            cp_comm_s += count * cost.cp_comm_s
            wgrad_s += count * cost.wgrad_s
            params += count * cost.params
            trained += count * cost.trained
            weight_bytes += count * cost.weight_bytes
            fp8_workspace += count * cost.fp8_workspace_bytes
            acts += count * cost.act_bytes
            if cost.working_bytes > working:
                working, working_kind = cost.working_bytes, layer.kind.value
            if layer.kind is not LayerKind.LOSS and cost.working_bytes > backward_working:
                backward_working, backward_kind = cost.working_bytes, layer.kind.value
            largest = max(largest, cost.gathered)
            gathers += count * cost.gathers
    sums = ChunkSums(compute_s, backward_s, tp_comm_s, cp_comm_s, wgrad_s, params,
                      acts / len(compositions), working, largest, gathers, trained, weight_bytes,
                      working_kind, fp8_workspace, backward_working, backward_kind)
    memo(problem)[key] = sums
    return sums


def rank_base(problem: Problem, plan: Plan, rank: int, split: Split,
              links: dict[str, GroupLinks], stages: tuple | None = None
              ) -> tuple[ChunkSums, float, "HeldParams"]:
    """(layer sums, pipeline-send time, parameters held) of a rank running ``stages`` (default:
    its chunks of the plan's layout); shared by equal ranks."""
    stages = stages or rank_stages(plan, rank)
    key = ("rank", stages, split, plan.recompute, plan.recompute_num_layers, links["tp"],
           links["pp"], links["cp"])
    cached = memo(problem).get(key)
    if cached is None:
        compositions = chunk_compositions(problem, plan, stages)
        sums = chunk_sums(problem, compositions, split, links["tp"], links["cp"])
        pp_comm_s = (pp_comm(problem, plan, stages, links["pp"], links["tp"]) if plan.pp > 1
                     else 0.0)
        cached = memo(problem)[key] = (sums, pp_comm_s, held_params(problem, plan, sums, stages))
    return cached


@dataclass(frozen=True, slots=True)
class HeldParams:
    """Parameters one GPU holds (before ZeRO sharding): all, those trained, and the bytes of
    their weights as stored."""

    count: float
    trained: float
    weight_bytes: float

    def without(self, params: float, trained: float) -> "HeldParams":
        """Less ``params`` 2-byte weights, ``trained`` of them trained."""
        return HeldParams(self.count - params, self.trained - trained,
                          self.weight_bytes - WEIGHT_BYTES * params)


def held_params(problem: Problem, plan: Plan, sums: ChunkSums,
                stages: tuple[tuple[int, int], ...]) -> HeldParams:
    """What a rank's layers hold, plus its copy of tied weights, trained where the layer
    they are tied to (the embedding, layer 0) trains, and TE's cached FP8 weights where the
    plan keeps 16-bit weights (fp8.weights_cached_beside)."""
    tied = _tied_copy_params(problem, stages) / plan.tp
    first = problem.graph.layers[0]
    tied_trained = tied * first.trainable_params / first.num_params if first.num_params else 0.0
    workspace = sums.fp8_workspace_bytes if weights_cached_beside(plan.zero_stage) else 0.0
    return HeldParams(sums.params + tied, sums.trained + tied_trained,
                      sums.weight_bytes + WEIGHT_BYTES * tied + workspace)


def plan_split(problem: Problem, plan: Plan) -> Split:
    """``Split.of`` the plan under the problem's attention kernel, one record per division of
    the micro-batch, kept: its hash, cached in it, then serves every memo it keys."""
    key = ("split", plan.tp, plan.cp, plan.sequence_parallel, plan.micro_batch_size)
    split = memo(problem).get(key)
    if split is None:
        split = memo(problem)[key] = Split.of(plan, problem.flash_attention, problem.runtime)
    return split


def rank_cost(problem: Problem, plan: Plan, rank: int, links: dict[str, GroupLinks],
              stages: tuple | None = None) -> RankCost:
    """What pipeline rank ``rank`` costs running ``stages`` (default: its chunks of the plan's
    layout) under the plan's degrees and switches."""
    stages = stages or rank_stages(plan, rank)
    split = plan_split(problem, plan)
    sums, pp_comm_s, holds = rank_base(problem, plan, rank, split, links, stages)
    experts, ep_comm_s, routing_s = _rank_experts(problem, plan, split, links, stages)
    holds = holds.without(experts * (plan.ep - 1), experts * (plan.ep - 1))  # 1/ep of experts
    params = holds.count
    states = _model_states(problem, plan, holds.without(experts, experts), experts)
    acts_per_chunk = sums.acts_per_chunk + _held_output_bytes(problem, plan, stages, split)
    activations = rank_activations(problem, plan, rank, stages, split, links, sums)
    other, excess = other_bytes(problem, plan, activations, sums.largest, params, holds.trained,
                                tensors=stage_tensors(problem, plan, stages, split),
                                states=states.total)
    compute_s = sums.compute_s + routing_s + grad_accumulation_time(problem, plan, holds.trained)
    return RankCost(rank, compute_s + sums.tp_comm_s + sums.cp_comm_s + pp_comm_s + ep_comm_s,
                     compute_s, sums.backward_s, sums.tp_comm_s, sums.cp_comm_s, sums.wgrad_s,
                     pp_comm_s, states, activations, other, params,
                     acts_per_chunk, sums.largest, sums.gathers, ep_comm_s, experts,
                     holds.trained, excess)


def grad_accumulation_time(problem: Problem, plan: Plan, trained: float) -> float:
    """Seconds per micro-batch a GPU holding ``trained`` trained parameters spends folding each
    micro-batch's gradients into the accumulated ones, a memory-bound pass after the backward
    of the runtime's ``grad_accumulation_bytes`` per parameter (DeepSpeed: AccumulateGrad's
    in-place add), or ``bf16_optimizer_accumulation_bytes`` where bf16 at ZeRO 0 with a
    pipeline runs BF16_Optimizer (its fp32 update each micro-batch). ZeRO-2/3 reduce
    gradients in their backward hooks instead, not priced here."""
    runtime = problem.runtime
    bf16_optimizer = problem.precision == "bf16" and plan.zero_stage == 0 and plan.pp > 1
    per_param = (runtime.bf16_optimizer_accumulation_bytes if bf16_optimizer
                 else runtime.grad_accumulation_bytes)
    if not per_param or plan.zero_stage > 1:
        return 0.0
    gpu = problem.cluster.gpu
    return trained * per_param / (gpu.memory_bandwidth_Bps * problem.compute.memory_efficiency)


def _model_states(problem: Problem, plan: Plan, dense: HeldParams, experts: float) -> ModelStates:
    """Model states of a GPU: the dense parameters sharded over the dp*cp replicas, the experts
    EP split (``experts``, 0 when ep = 1; priced as trained) over the dp*cp/ep ranks that hold
    the same ones; where the runtime wraps the model in torch DDP, its buckets' copy of the
    dense gradients (memory.ddp_bucket_copy_bytes)."""
    optimizer = problem.training.optimizer
    held = (in_backward_grads_held(problem.graph.layers, plan.tp)
            if problem.training.optimizer_in_backward else None)
    states = model_state_bytes(dense.count, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp,
                               offload=plan.offload, runtime=problem.runtime,
                               trained=dense.trained, weight_bytes=dense.weight_bytes,
                               optimizer=optimizer, grads_held=held)
    runtime = problem.runtime
    ddp_copy = ddp_bucket_copy_bytes(dense.trained, bytes_per_param=runtime.ddp_bucket_copy_bytes,
                                     data_parallel=plan.dp * plan.cp, zero_stage=plan.zero_stage,
                                     max_zero_stage=runtime.ddp_max_zero_stage)
    states = ModelStates(states.weights, states.gradients + ddp_copy, states.optimizer)
    if not experts:
        return states
    own = model_state_bytes(experts, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp // plan.ep,
                            offload=plan.offload, runtime=problem.runtime, optimizer=optimizer)
    return ModelStates(states.weights + own.weights, states.gradients + own.gradients,
                       states.optimizer + own.optimizer)


def _rank_experts(problem: Problem, plan: Plan, split: Split, links: dict[str, GroupLinks],
                  stages: tuple) -> tuple[float, float, float]:
    """(expert parameters one GPU holds when EP splits them, EP all-to-all seconds and
    routing compute seconds per micro-batch) of a rank running ``stages``."""
    key = ("experts", stages, split, plan.ep, plan.recompute, plan.recompute_num_layers,
           links.get("ep"))
    cached = memo(problem).get(key)
    if cached is None:
        params = seconds = routing = 0.0
        gpu = problem.cluster.gpu
        for composition in chunk_compositions(problem, plan, stages):
            for class_id, count, recompute in composition:
                layer = problem.layer_class(class_id)
                if not layer.experts:
                    continue
                full = recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
                if plan.ep > 1:
                    params += count * expert_params(layer) / (plan.tp * plan.ep)
                    seconds += count * ep_comm_time(layer, split, links["ep"], full_recompute=full)
                routing += count * routing_time(layer, split, plan.ep, gpu=gpu,
                                                peak=gpu.peak_flops(problem.precision),
                                                profile=problem.compute, full_recompute=full)
        cached = memo(problem)[key] = (params, seconds, routing)
    return cached


@dataclass(frozen=True, slots=True)
class ChunkMemory:
    """One of a rank's chunks per micro-batch: the bytes it keeps until its backward (with the
    stage output a pipeline engine holds), the largest transient of its backward (or loss) and
    the kind of layer that has it."""

    kept: float
    working: float
    working_kind: str = ""


def chunk_memories(problem: Problem, plan: Plan, stages: tuple[tuple[int, int], ...],
                   split: Split, links: dict[str, GroupLinks]) -> tuple[ChunkMemory, ...]:
    """:class:`ChunkMemory` of each chunk of a rank running ``stages``: an interleaved rank's
    chunks differ where one holds the embedding or the head and loss, or the split is
    uneven. Under Megatron-FSDP's ZeRO-2 a chunk's backward also holds its queue of unsharded
    gradients (:func:`_reduce_queue_bytes`) beside a layer's backward transient (not the
    loss's, which comes before any gradient)."""
    key = ("chunk memories", stages, split, plan.recompute, plan.recompute_num_layers,
           links["tp"], links["cp"], plan.zero_stage)
    found = memo(problem).get(key)
    if found is None:
        chunks = []
        for composition, stage in zip(chunk_compositions(problem, plan, stages), stages):
            sums = chunk_sums(problem, (composition,), split, links["tp"], links["cp"])
            kept = sums.acts_per_chunk + _held_output_bytes(problem, plan, (stage,), split)
            queue = _reduce_queue_bytes(problem, plan, sums, kept, split, links, stage)
            if queue and sums.backward_working + queue > sums.working:
                chunks.append(ChunkMemory(kept, sums.backward_working + queue,
                                          sums.backward_kind))
            else:
                chunks.append(ChunkMemory(kept, sums.working, sums.working_kind))
        found = memo(problem)[key] = tuple(chunks)
    return found


def _reduce_queue_bytes(problem: Problem, plan: Plan, sums: ChunkSums, kept: float,
                        split: Split, links: dict[str, GroupLinks],
                        stage: tuple[int, int]) -> float:
    """What the unsharded gradient buckets of chunk ``stage`` (its layer ``sums``) add to its
    backward where the runtime's ZeRO-2 reduce-scatters them every micro-batch
    (memory.reduce_queue_bytes): the trained parameters the GPU holds (``sums`` count every
    expert, the GPU holds 1/ep of them) in units of its largest layer, each freeing an even
    share of the ``kept`` activations; 0 otherwise."""
    if not reduces_every_microbatch(problem.runtime, plan.zero_stage) or sums.trained <= 0:
        return 0.0
    experts = _rank_experts(problem, plan, split, links, (stage,))[0]
    held = sums.trained - experts * (plan.ep - 1)
    units = math.ceil(sums.trained / sums.largest)
    return reduce_queue_bytes(held / units, units,
                              queue_params=problem.runtime.zero2_reduce_queue_params,
                              grad_bytes=problem.runtime.grad_bytes,
                              freed_per_unit=kept / units)


@dataclass(frozen=True, slots=True)
class InFlightPeak:
    """The activation side of a rank's peak: its ``bytes``, the chunk-micro-batches ``held``
    in flight then, the kind of layer whose backward (or loss) runs (``working_kind``), or,
    ``accumulating``, the gradients' copies after a micro-batch's backward."""

    bytes: float
    held: int
    working_kind: str = ""
    accumulating: bool = False


def activation_peak(problem: Problem, plan: Plan, rank: int,
                    chunks: tuple[ChunkMemory, ...], sums: ChunkSums) -> InFlightPeak:
    """The activation side of rank ``rank``'s peak over its schedule
    (pipeline.in_flight_moments: the chunk-micro-batches of each chunk in flight as each
    backward starts): those in flight with the backward chunk's largest transient, or the
    gradients' copies after that backward, its micro-batch freed
    (:func:`grad_accumulation_moment_bytes`)."""
    copies = grad_accumulation_moment_bytes(problem, plan, sums, 0.0)
    peak, held, chunk, accumulating = _peak_over_moments(
        (rank, plan.pp, plan.vpp, plan.num_microbatches), tuple(c.kept for c in chunks),
        tuple(c.working for c in chunks), copies)
    return InFlightPeak(peak, held, "" if accumulating else chunks[chunk].working_kind,
                        accumulating)


@lru_cache(maxsize=65536)
def _peak_over_moments(schedule: tuple[int, int, int, int], kept: tuple[float, ...],
                       working: tuple[float, ...], copies: float) -> tuple[float, int, int, bool]:
    """(bytes, chunk-micro-batches in flight, backward chunk, after it) at the largest of the
    moments of ``schedule`` (rank, pp, vpp, micro-batches: in_flight_moments): the chunks'
    ``kept`` bytes times their micro-batches in flight, plus the backward chunk's ``working``
    transient, or after it, that micro-batch freed, the gradients' ``copies`` (none where 0).
    Memoized (keyed by the schedule, not its moments, whose hash a deep pipeline would pay
    on every call): equal ranks share it."""
    rank, pp, vpp, num_microbatches = schedule
    best = (0.0, 0, 0, False)
    for counts, chunk in in_flight_moments(rank, pp=pp, vpp=vpp,
                                           num_microbatches=num_microbatches):
        in_flight = sum(map(mul, counts, kept))
        backward = in_flight + working[chunk]
        if backward > best[0]:
            best = (backward, sum(counts), chunk, False)
        if copies and in_flight - kept[chunk] + copies > best[0]:
            best = (in_flight - kept[chunk] + copies, sum(counts) - 1, chunk, True)
    return best


def rank_activations(problem: Problem, plan: Plan, rank: int, stages: tuple[tuple[int, int], ...],
                     split: Split, links: dict[str, GroupLinks], sums: ChunkSums) -> float:
    """Activation-side bytes at rank ``rank``'s peak (:func:`activation_peak`), with the
    outputs DeepSpeed's pipe buffers keep (:func:`_kept_last_outputs`) or torch's pipelining
    returns (:func:`_returned_last_outputs`)."""
    chunks = chunk_memories(problem, plan, stages, split, links)
    held = in_flight_chunks(rank, pp=plan.pp, vpp=plan.vpp, num_microbatches=plan.num_microbatches)
    return (activation_peak(problem, plan, rank, chunks, sums).bytes
            + _kept_last_outputs(problem, plan, stages, split, held)
            + _returned_last_outputs(problem, plan, stages, split))


def _returned_last_outputs(problem: Problem, plan: Plan, stages: tuple[tuple[int, int], ...],
                           split: Split) -> float:
    """The last-stage outputs torch's pipelining keeps to return from the step, where it does
    (``pp_keeps_last_outputs``): on the rank whose chunk ends in the loss, every earlier
    micro-batch's logits as the LM head returns them (vocab-split over TP, as torchtitan's loss
    parallel leaves them), held to the last micro-batch's backward, counted all step (the last
    stage's other activations are one micro-batch's throughout)."""
    if not (problem.runtime.pp_keeps_last_outputs and plan.pp > 1):
        return 0.0
    first, num = stages[-1]
    head = logits_layer(problem, problem.graph.layers[first + num - 1])
    if head is None:
        return 0.0
    return (plan.num_microbatches - 1) * head.boundary_bytes * split.mbs / (split.tp * split.cp)


def grad_accumulation_moment_bytes(problem: Problem, plan: Plan, sums: ChunkSums,
                                   others: float) -> float:
    """Activation-side bytes as a micro-batch's gradients are accumulated after its backward
    (memory.upcast_grad_moment_bytes), ``others`` bytes of other chunk-micro-batches in
    flight: the copy of the largest gradient (an fp32 upcast, or the 16-bit gradient being
    added into ``.grad``: memory.grad_copy_bytes_per_element), or where the runtime
    accumulates only after the whole backward, every 16-bit gradient of the rank's chunks
    (``grads_before_accumulation_bytes``); 0 where it copies none."""
    runtime = problem.runtime
    per_element = grad_copy_bytes_per_element(
        upcast_bytes=runtime.grad_upcast_bytes,
        accumulates_into_grad=runtime.accumulates_into_grad and plan.zero_stage <= 1,
        num_microbatches=plan.num_microbatches)
    copies = [(sums.largest, per_element), (sums.trained, runtime.grads_before_accumulation_bytes)]
    return max((upcast_grad_moment_bytes(params, bytes_per_element=per_element_bytes,
                                         others=others)
                for params, per_element_bytes in copies if per_element_bytes), default=0.0)


def _kept_last_outputs(problem: Problem, plan: Plan, stages: tuple[tuple[int, int], ...],
                       split: Split, held: int) -> float:
    """The fp32 logits DeepSpeed's PipelineEngine keeps on the last stage beyond the in-flight
    micro-batch's (memory.last_stage_output_slots): the rank whose chunk ends in the loss."""
    if not problem.runtime.pp_holds_stage_outputs:
        return 0.0
    layers = problem.graph.layers
    head = logits_layer(problem, layers[stages[-1][0] + stages[-1][1] - 1])
    if head is None:
        return 0.0
    element = 4 if problem.precision == "fp32" else WEIGHT_BYTES
    stale = max(0, last_stage_output_slots(plan.num_microbatches) - held)
    return stale * held_fp32_logits_bytes(head.boundary_bytes, split, logit_element_bytes=element)


def other_bytes(problem: Problem, plan: Plan, activations: float,
                largest_gathered: float, params: float, trained: float, *,
                tensors: tuple[tuple[LayerTensors, ...], StageOutput | None],
                states: float) -> tuple[float, float]:
    """(memory besides model states and activations, the part of it the allocator reserves
    beyond its allocated peak). Outside the allocator the CUDA context, NCCL and userbuffers
    buffers (:func:`outside_allocator_bytes`); a ZeRO optimizer's gradient-reduction bucket
    (DeepSpeed allocates it whole); Transformer Engine's cuBLAS workspaces under the TP overlap
    (tp_overlap.te_workspace_bytes); with ZeRO-3 the
    unsharded copies of the gathered units (memory.zero3_buffer_bytes) of a GPU holding
    ``params`` parameters; the gradient reduction's and optimizer step's transients beyond
    the activations they follow; and what the caching allocator reserves beyond that by its
    rules for the stage's step (step_allocations.step_segments, the replay's closed form;
    :func:`reserved_total_bytes`) for its layer and output ``tensors``
    (:func:`stage_tensors`), beside ``states`` bytes of model states (the micro-batches in
    flight do not change it: ``activations`` has them)."""
    runtime = problem.runtime
    allocated = outside_allocator_bytes(problem, plan)
    if plan.zero_stage >= 1:
        allocated += runtime.zero_bucket_bytes
    if userbuffers_allocated(problem, plan):
        allocated += tp_overlap.te_workspace_bytes(problem.cluster.gpu.compute_capability)
    if plan.zero_stage >= 3:
        allocated += zero3_buffer_bytes(
            largest_gathered, params, bytes_per_param=runtime.zero3_gather_bytes,
            pipeline_resident=pipeline_resident(runtime, plan.zero_stage, plan.pp))
    transients = step_transients(problem, plan, largest_gathered, params, trained)
    layers, output = tensors
    segments = step_segments(layers, num_microbatches=plan.num_microbatches,
                             step_transients=transients, output=output)
    cached, least = (states + allocated + dynamic_reserved_bytes(problem, segments, activations,
                                                                 released=released)
                     for released in (False, True))
    total = reserved_total_bytes(cached, least, problem.cluster.gpu.memory_bytes)
    allocated_peak = states + allocated + max(activations, segments.least)
    return total - states - activations, total - allocated_peak


def reserved_total_bytes(cached: float, least: float, device: float) -> float:
    """A GPU's memory at the step's high-water mark: ``cached``, the allocator keeping every
    freed block, where that fits the ``device``; else the device full, the allocator having
    returned its free segments to grow, unless even ``least`` (the step on a full device)
    exceeds it: out of memory, by that much."""
    if cached <= device:
        return cached
    return max(device, least)


def dynamic_reserved_bytes(problem: Problem, segments: StepSegments, activations: float, *,
                           released: bool) -> float:
    """What the caching allocator reserves for the step's activations and transients at its
    high-water mark: the cuBLAS workspaces, and the larger of two moments. The backward: the
    ``activations`` with the stated ``fragmentation`` share (the many tensor sizes of a real
    backward, measured on recorded steps). The gradient reduction and optimizer step: on top
    of every block the backward cached, the segments their transients take because no cached
    block serves them, and at least the segments of the pipe buffers and of the largest
    transient; or, ``released`` (a full device, whose free segments the allocator returns
    before it grows), those alone (step_allocations.step_segments)."""
    backward = activations * (1 + problem.runtime.fragmentation)
    step = segments.least if released else max(backward + segments.new, segments.least)
    return workspace_bytes(problem) + max(backward, step)


def stage_tensors(problem: Problem, plan: Plan, stages: tuple[tuple[int, int], ...],
                  split: Split) -> tuple[tuple[LayerTensors, ...], StageOutput | None]:
    """What a rank allocates per micro-batch (step_allocations): layer by layer, each layer's kept
    and working bytes (layers.layer_memory_bytes) as its attention scores and GEMM outputs
    (memory.layer_tensor_shapes; a fully recomputed block keeps its input alone) and the rest
    in tensors of the layer's output on one GPU (the loss's in fp32 logits), the chunks of an
    interleaved rank one after the other; and the stage output a pipeline engine holds
    (:func:`_stage_output`, one chunk per rank where it does)."""
    return (_layer_tensors(problem, plan, stages, split),
            _stage_output(problem, plan, stages[-1], split))


def _layer_tensors(problem: Problem, plan: Plan, stages: tuple[tuple[int, int], ...],
                   split: Split) -> tuple[LayerTensors, ...]:
    """:func:`stage_tensors`' layers, kept by what they depend on: the layers, the split and
    the recompute switches, not the micro-batch count (only the stage output's slots do),
    so plans that differ in the global batch or in ZeRO share them."""
    key = ("tensors", stages, split, plan.recompute, plan.recompute_num_layers)
    found = memo(problem).get(key)
    if found is not None:
        return found
    tensors = []
    for composition in chunk_compositions(problem, plan, stages):
        for class_id, count, recompute in composition:
            layer = problem.layer_class(class_id)
            kept, working = layer_memory_bytes(problem, layer, split, recompute)
            unit = _output_tensor_bytes(problem, layer, split)
            shapes = layer_tensor_shapes(layer, split)
            full = recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
            tensors.append(LayerTensors(tensors_of(kept, unit, () if full else shapes),
                                        tensors_of(working, unit, shapes), count))
    found = memo(problem)[key] = tuple(tensors)
    return found


def _stage_output(problem: Problem, plan: Plan, stage: tuple[int, int],
                  split: Split) -> StageOutput | None:
    """The output a pipeline engine keeps per micro-batch of ``stage`` (_held_output_bytes),
    for the chunk that ends in the loss in the pipe buffers that outlive its backward."""
    if not problem.runtime.pp_holds_stage_outputs:
        return None
    first, num = stage
    ends_in_loss = logits_layer(problem, problem.graph.layers[first + num - 1]) is not None
    slots = last_stage_output_slots(plan.num_microbatches) if ends_in_loss else 0
    return StageOutput(int(_held_output_bytes(problem, plan, (stage,), split)), slots)


def _output_tensor_bytes(problem: Problem, layer, split: Split) -> float:
    """A layer's output per micro-batch on one GPU (split by SP, by CP), or for the loss the
    fp32 logits it works on (memory.held_fp32_logits_bytes)."""
    head = logits_layer(problem, layer)
    if head is not None:
        return held_fp32_logits_bytes(head.boundary_bytes, split,
                                      logit_element_bytes=4 if problem.precision == "fp32"
                                      else WEIGHT_BYTES)
    sequence_div = split.tp if split.sp else 1
    return layer.boundary_bytes * split.mbs / (split.cp * sequence_div)


def workspace_bytes(problem: Problem) -> float:
    """The runtime's cuBLAS workspaces, or torch's default for the cluster's GPU."""
    stated = problem.runtime.cublas_workspace_bytes
    if stated is not None:
        return stated
    return cublas_workspace_bytes(problem.cluster.gpu.compute_capability)


COLLECTIVE_GROUPS = ("tp", "cp", "dp", "ep", "expert_dp")
"""The plan's communicators that run collectives (placement.plan_links; PP only sends and
receives, which never take NVLS)."""


def outside_allocator_bytes(problem: Problem, plan: Plan) -> float:
    """Device memory a GPU holds outside PyTorch's caching allocator: the runtime's CUDA
    context and NCCL allowance, the NVLink SHARP buffers of each collective communicator
    the GPU is in (memory.nvls_buffer_bytes) and Transformer Engine's userbuffers under the TP
    overlap (tp_overlap.userbuffer_bytes); none where the runtime prices no device, as
    ``verify`` on CPU."""
    context = problem.runtime.cuda_context_bytes
    if not context:
        return 0.0
    key = ("outside_allocator", plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.placement,
           plan.sequence_parallel, plan.micro_batch_size)
    found = memo(problem).get(key)  # the same for every rank and switch of a shape
    if found is None:
        gpu = problem.cluster.gpu
        links = plan_links(problem, plan)
        found = memo(problem)[key] = context + sum(
            nvls_buffer_bytes(links[group].members_per_node,
                              compute_capability=gpu.compute_capability,
                              nvswitch=links[group].intra_kind == "nvswitch")
            for group in COLLECTIVE_GROUPS if group in links and links[group].size > 1) + (
            tp_overlap.userbuffer_bytes(_block_activation_bytes(problem, plan),
                                        problem.precision == "fp8")
            if userbuffers_allocated(problem, plan) else 0.0)
    return found


def userbuffers_allocated(problem: Problem, plan: Plan) -> bool:
    """Whether the run sets up Transformer Engine's userbuffers (costmodels.tp_overlap):
    ``tp_comm_overlap`` with SP, TP inside one node."""
    if not (problem.runtime.tp_comm_overlap and plan.sequence_parallel and plan.tp > 1):
        return False
    return plan_links(problem, plan)["tp"].num_nodes == 1


def _block_activation_bytes(problem: Problem, plan: Plan) -> float:
    """A block's output for one micro-batch, whole sequence (the shape Megatron passes
    ``initialize_ub``): 2 bytes an element."""
    block = next((l for l in problem.graph.layers if l.kind is LayerKind.BLOCK), None)
    return block.boundary_bytes * plan.micro_batch_size / plan.cp if block else 0.0


def _tied_copy_params(problem: Problem, stages: tuple[tuple[int, int], ...]) -> float:
    """Weights tied to an earlier layer (the LM head to the embedding) that a pipeline rank
    runs apart from that layer: Megatron keeps a copy on the rank that runs the tied layer
    (the last stage's, or the one before a stage of the loss alone), none when the same rank
    also runs layer 0."""
    if any(first == 0 for first, _ in stages):
        return 0.0
    return sum(problem.layer_class(c).tied_params * k
               for first, num in stages for c, k in problem.layer_counts(first, num))


def pp_comm(problem: Problem, plan: Plan, stages: tuple, links: GroupLinks,
            tp_links: GroupLinks | None = None) -> float:
    """Activation sends forward and gradient sends backward, per micro-batch, for each chunk:
    the blocking transfers the runtime's schedule puts on the rank's stream
    (pipeline.blocking_transfers), each of 1/tp of the boundary with scatter-gather; where the
    runtime partitions them as DeepSpeed does, each also carries its partition's meta tensor
    (a second blocking send) and the TP group all-gathers the pieces back
    (pipeline.partition_gathers, over ``tp_links``)."""
    layers = problem.graph.layers
    runtime = problem.runtime
    total = 0.0
    for start, num in stages:
        first, last = layers[start], layers[start + num - 1]
        boundary = max(first.input_bytes, last.boundary_bytes)
        full = boundary * plan.micro_batch_size / plan.cp
        split = runtime.pp_scatter_gather and plan.tp > 1
        message = full / plan.tp if split else full
        has_prev, has_next = start > 0, start + num < len(layers)
        transfers = blocking_transfers(has_prev=has_prev, has_next=has_next,
                                       batched=runtime.pp_batched_p2p)
        seconds = comm.p2p_time(message, links)
        if split and runtime.pp_partition_gathers:
            seconds += comm.p2p_time(partition_meta_bytes(plan.tp), links)
            if tp_links is not None:
                total += (partition_gathers(has_prev=has_prev, has_next=has_next)
                          * comm.all_gather_time(full, tp_links))
        total += transfers * seconds
    return total


def rank_groups(problem: Problem, plan: Plan) -> list[list[int]]:
    """Pipeline ranks grouped by what they run (same layers, same boundaries): a balanced
    pipeline has a handful of groups however deep it is, and equal ranks cost the same."""
    key = ("groups", plan.layout, plan.pp, plan.vpp, plan.recompute, plan.recompute_num_layers)
    groups = memo(problem).get(key)
    if groups is None:
        by_signature: dict[tuple, list[int]] = {}
        for rank in range(plan.pp):
            by_signature.setdefault(rank_signature(problem, plan, rank), []).append(rank)
        groups = memo(problem)[key] = list(by_signature.values())
    return groups


def rank_signature(problem: Problem, plan: Plan, rank: int) -> tuple:
    """What a rank's cost depends on in the plan's layout: whether it is the last rank, the
    layer classes of each of its chunks in order, and which chunks hold the model's first or
    last layer; not where in the model its layers sit (alike layers cost the same anywhere)."""
    stages = rank_stages(plan, rank)
    end = len(problem.graph.layers)
    return ((rank == plan.pp - 1,) + chunk_compositions(problem, plan, stages)
            + tuple((first == 0, first + num == end) for first, num in stages))


def step_transients(problem: Problem, plan: Plan, largest_module: float,
                    params: float, trained: float) -> tuple[int, ...]:
    """The allocations, one after the other, of the gradient reduction and the optimizer step
    on a GPU holding ``params`` parameters, ``trained`` of them trained: the copy the
    runtime's own all-reduce makes of the gradients where it has one (DeepSpeed's engine
    under BF16_Optimizer, memory.reduction_copy_bytes), then ZeRO-1/2's fp64 copy of the largest gradient
    (``largest_module``: DeepSpeed's largest parameter-owning module) of its 1/dp partition
    for the norm, and ZeRO-1's flat copy of its partition's gradients beyond the gradients it
    frees (memory.flat_grad_copy_excess_bytes)."""
    runtime = problem.runtime
    shards = plan.dp * plan.cp
    sizes = []
    if shards > 1:
        sizes.append(reduction_copy_bytes(trained, bytes_per_param=runtime.reduction_copy_bytes))
    if plan.zero_stage in (1, 2):
        sizes.append(grad_norm_copy_bytes(largest_module, params / shards,
                                          bytes_per_element=runtime.grad_norm_bytes))
        if runtime.step_flattens_grads and plan.zero_stage == 1:
            sizes.append(flat_grad_copy_excess_bytes(trained, grad_bytes=runtime.grad_bytes,
                                                     dp=shards))
    return tuple(int(size) for size in sizes if size > 0)


def _held_output_bytes(problem: Problem, plan: Plan, stages: tuple[tuple[int, int], ...],
                       split: Split) -> float:
    """Bytes per in-flight micro-batch chunk of the stage output a pipeline engine keeps until
    that micro-batch's backward is done: the chunk's last layer's output (replicated over TP),
    or for the chunk that ends in the loss the fp32 logits (memory.held_fp32_logits_bytes; the
    engine runs even a single stage, as Megatron-DeepSpeed does at PP 1)."""
    if not problem.runtime.pp_holds_stage_outputs:
        return 0.0
    layers = problem.graph.layers
    total = 0.0
    for first, num in stages:
        last = layers[first + num - 1]
        head = logits_layer(problem, last)
        if head is not None:
            element = 4 if problem.precision == "fp32" else WEIGHT_BYTES
            total += held_fp32_logits_bytes(head.boundary_bytes, split, logit_element_bytes=element)
        else:
            total += last.boundary_bytes * split.mbs / split.cp
    return total / len(stages)
