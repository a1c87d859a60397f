"""One estimate() for everything: the step time and per-GPU memory of a plan.

The solver tabulates it, ``autoplan estimate`` prints it and the brute-force reference enumerates
it, so all three agree by construction. The step is
    pipeline(per-rank micro-batch times) + exposed data-parallel reduction + optimizer step
where a rank's micro-batch time is its layers' compute (compute.py), their exposed TP
collectives and its pipeline sends (comm.py); memory is model states plus in-flight
activations plus a stated allowance (memory.py) on the worst rank. Plans whose stages run on
different node groups of a heterogeneous cluster are costed stage by stage (groups.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from autoplan.cluster.spec import Cluster
from autoplan.cluster.topology import GroupLinks, group_links
from autoplan.costmodels import comm
from autoplan.costmodels.context import ring_attention_time
from autoplan.costmodels.experts import ep_comm_time, expert_params
from autoplan.costmodels.compute import LayerTime, Split, layer_time
from autoplan.costmodels.memory import (
    WEIGHT_BYTES, ModelStates, in_flight_chunks, layer_activation_bytes, layer_params_on_gpu,
    allocator_slack_bytes, layer_trained_on_gpu, layer_weight_bytes, loss_peak_bytes,
    model_state_bytes, in_backward_grads_held, backward_working_bytes, optimizer_step_bytes,
    zero3_buffer_bytes,
)
from autoplan.costmodels.pipeline import pipeline_time
from autoplan.costmodels.profiles import ComputeProfile, RuntimeProfile, compute_profile
from autoplan.graph.layer_graph import Layer, LayerGraph, LayerKind
from autoplan.plan import Estimate, Offload, PipelineSchedule, Plan, Recompute
from autoplan.training import AttentionKernel, TrainingSpec
from autoplan.units import GIB

HOST_LINK_BPS = 25e9
"""[Empirical] achieved PCIe 4.0 x16 host<->GPU copy bandwidth (of 31.5 GB/s) for offload, when
cluster.yaml states no ``host_bandwidth``."""

CPU_ADAM_PARAMS_PER_S = 1.0e9
"""[Empirical] DeepSpeed CPUAdam throughput per GPU's share of a host (ZeRO-Offload, Ren et al.
2021, reports ~1B parameters/s on a 2-socket server)."""


@dataclass(frozen=True)
class Problem:
    """Everything an estimate depends on besides the plan."""

    graph: LayerGraph
    cluster: Cluster
    training: TrainingSpec
    runtime: RuntimeProfile
    compute: ComputeProfile
    mem_limit_bytes: float
    headroom: float = 0.0
    """Fraction of each GPU's memory kept free (``mem_limit_bytes`` already has it)."""
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        classes: dict[tuple, int] = {}
        index = [classes.setdefault(_layer_key(l), len(classes)) for l in self.graph.layers]
        firsts = {c: index.index(c) for c in range(len(classes))}
        prefix = [[0] * (len(index) + 1) for _ in classes]
        for i, c in enumerate(index):
            for k in range(len(classes)):
                prefix[k][i + 1] = prefix[k][i] + (c == k)
        object.__setattr__(self, "_classes", [self.graph.layers[firsts[c]] for c in range(len(classes))])
        object.__setattr__(self, "_prefix", prefix)

    def layer_counts(self, first: int, num: int) -> tuple[tuple[int, int], ...]:
        """(class id, how many) of each distinct layer in ``layers[first:first+num]``; equal
        layers (the replicated blocks) share a class."""
        key = ("counts", first, num)
        counts = self._cache.get(key)
        if counts is None:
            end = first + num
            counts = tuple((c, p[end] - p[first]) for c, p in enumerate(self._prefix)
                           if p[end] - p[first])
            self._cache[key] = counts
        return counts

    def layer_class(self, class_id: int) -> Layer:
        return self._classes[class_id]

    def on_group(self, name: str) -> "Problem":
        """The problem on one node group of a heterogeneous cluster: its GPU and links, its
        GPU's compute profile (the given one where the group has the cluster's first GPU), and
        the memory limit capped at its GPU's memory less the headroom. Its layers drop their names, so equal
        blocks share one class and a stage's costs depend on how many blocks it has, not which."""
        key = ("on_group", name)
        sub = self._cache.get(key)
        if sub is None:
            group = next(g for g in self.cluster.groups if g.name == name)
            compute = (self.compute if group.gpu == self.cluster.gpu
                       else compute_profile(group.gpu.name))
            sub = self._cache[key] = Problem(
                _unnamed(self.graph), group, self.training, self.runtime, compute,
                min(self.mem_limit_bytes, group.gpu.memory_bytes * (1 - self.headroom)),
                self.headroom)
        return sub

    @property
    def precision(self) -> str:
        return self.training.precision.value

    @property
    def flash_attention(self) -> bool:
        return self.training.attention is AttentionKernel.FLASH


def _unnamed(graph: LayerGraph) -> LayerGraph:
    """The graph with layer and module names dropped (they cost nothing)."""
    return replace(graph, layers=tuple(replace(l, name="", modules=()) for l in graph.layers))


MIB = 2**20


def memory_mib(peak_bytes: float) -> int:
    """Worst-GPU memory rounded up to whole MiB: the unit in which plans are compared."""
    return math.ceil(peak_bytes / MIB)


def limit_mib(problem: Problem) -> int:
    """The memory limit rounded down to whole MiB."""
    return int(problem.mem_limit_bytes // MIB)


@dataclass(frozen=True, slots=True)
class _LayerCost:
    """A layer's per-micro-batch costs on one GPU under a given split and recompute."""

    compute_s: float
    backward_s: float
    tp_comm_s: float
    cp_comm_s: float
    wgrad_s: float
    act_bytes: float
    working_bytes: float
    params: float
    gathered: float
    gathers: int
    trained: float  # of params, those that require grad
    weight_bytes: float  # the weights as stored (frozen ones in the frozen dtype)


@dataclass(frozen=True, slots=True)
class _RankCost:
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

    @property
    def memory(self) -> float:
        return self.states.total + self.activations + self.other


_IDENTITY_FIELDS = ("name", "modules")
"""Fields that name a layer without changing its costs: equal blocks share one class."""


def _layer_key(layer: Layer) -> tuple:
    return tuple(getattr(layer, f.name) for f in fields(Layer) if f.name not in _IDENTITY_FIELDS)


def _tp_messages(layer: Layer, split: Split) -> tuple[int, int, float]:
    """(forward all-reduces, backward all-reduces, message bytes) per micro-batch."""
    size = split.mbs / split.cp
    if layer.kind is LayerKind.BLOCK:
        return layer.tp_allreduces, layer.tp_allreduces, layer.boundary_bytes * size
    if layer.kind is LayerKind.HEAD:
        return 0, 1, layer.input_bytes * size
    return layer.tp_allreduces, 0, layer.boundary_bytes * size


def _layer_cost(problem: Problem, layer: Layer, class_id: int, split: Split,
                recompute: Recompute, tp_links: GroupLinks, cp_links: GroupLinks) -> _LayerCost:
    key = (class_id, split, recompute, tp_links, cp_links)
    cached = problem._cache.get(key)
    if cached is not None:
        return cached
    frozen_dtype = problem.training.frozen_storage
    t = layer_time(layer, split, recompute, gpu=problem.cluster.gpu, precision=problem.precision,
                   profile=problem.compute, frozen_dtype=frozen_dtype)
    fwd_n, bwd_n, message = _tp_messages(layer, split)
    one = comm.all_reduce_time(message, tp_links) if split.tp > 1 else 0.0
    full = recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
    bwd_comm = _tp_backward_comm(problem, layer, split, t, bwd_n, message, tp_links)
    tp_comm = fwd_n * one * (2 if full else 1) + bwd_comm
    cost = _LayerCost(
        compute_s=t.fwd_s + t.bwd_s + t.recompute_s, backward_s=t.bwd_s + t.recompute_s,
        tp_comm_s=tp_comm,
        cp_comm_s=ring_attention_time(layer, split, t, cp_links,
                                      recomputed=full or recompute is Recompute.SELECTIVE),
        wgrad_s=t.wgrad_s,
        act_bytes=_kept_bytes(problem, layer, split, recompute),
        working_bytes=_working_bytes(problem, layer, split),
        params=layer_params_on_gpu(layer, split.tp),
        gathered=_gathered_params(problem, layer, split.tp), gathers=_gather_units(problem, layer),
        trained=layer_trained_on_gpu(layer, split.tp),
        weight_bytes=layer_weight_bytes(layer, split.tp, frozen_dtype),
    )
    problem._cache[key] = cost
    return cost


def _kept_bytes(problem: Problem, layer: Layer, split: Split, recompute: Recompute) -> float:
    """What a layer keeps for backward per micro-batch. The cross-entropy of the logits keeps
    nothing across micro-batches: each one's backward starts right after its loss."""
    if _logits_layer(problem, layer) is not None:
        return 0.0
    return layer_activation_bytes(layer, split, recompute,
                                  op_sac=problem.runtime.selective_recompute == "op",
                                  gathered_inputs=problem.runtime.sp_saves_gathered_input)


def _working_bytes(problem: Problem, layer: Layer, split: Split) -> float:
    """Transient bytes of a layer's backward; for the loss, the runtime's cross-entropy."""
    head = _logits_layer(problem, layer)
    if head is None:
        return backward_working_bytes(layer, split,
                                      gathered_inputs=problem.runtime.sp_saves_gathered_input)
    element = 4 if problem.precision == "fp32" else WEIGHT_BYTES
    return loss_peak_bytes(head.boundary_bytes, split,
                           bytes_per_logit=problem.runtime.loss_bytes_per_logit,
                           logit_element_bytes=element)


def _logits_layer(problem: Problem, layer: Layer) -> Layer | None:
    """The LM head whose logits ``layer`` turns into the loss (None for other layers, and
    for a loss that does not follow a head)."""
    layers = problem.graph.layers
    if layer.kind is not LayerKind.LOSS or len(layers) < 2:
        return None
    return layers[-2] if layers[-2].kind is LayerKind.HEAD else None


def _gathered_params(problem: Problem, layer: Layer, tp: int) -> float:
    """Parameters of ``layer`` one GPU holds gathered at once under ZeRO-3: the whole layer
    (FSDP wraps each block) or its largest parameter-owning module (DeepSpeed fetches module by
    module), of which TP leaves 1/tp as of the whole layer."""
    on_gpu = layer_params_on_gpu(layer, tp)
    if problem.runtime.zero3_gather_unit != "module" or not layer.num_params:
        return on_gpu
    return layer.largest_module_params * on_gpu / layer.num_params


def _gather_units(problem: Problem, layer: Layer) -> int:
    """ZeRO-3 collectives per gather of ``layer``: one per parameter-owning module (DeepSpeed) or
    one for the layer (FSDP)."""
    if not layer.num_params:
        return 0
    return (layer.param_modules or 1) if problem.runtime.zero3_gather_unit == "module" else 1


def _tp_backward_comm(problem: Problem, layer: Layer, split: Split, t: LayerTime, count: int,
                      message: float, tp_links: GroupLinks) -> float:
    """Exposed TP communication of one layer's backward for one micro-batch.

    Without SP each column-parallel Linear all-reduces its input gradient. With SP (Korthikanti
    et al. 2022, sec. 4.2.2) each row-parallel Linear all-gathers its output gradient (the
    backward of its forward reduce-scatter), and each column-parallel Linear re-gathers its
    sequence-sharded input for the weight gradient and reduce-scatters its input gradient. With
    asynchronous TP communication (``tp_bwd_overlap``: Megatron-LM's async all-reduce) the
    column-parallel collectives run under that Linear's input-gradient (the gather) and
    weight-gradient (the reduction) GEMMs; the output-gradient gathers stay exposed. Full
    recompute keeps this overlap: its backward costs the baseline's plus one forward
    (Korthikanti et al. 2022, Table 4: 11.9 + 7.7 = 19.5 ms).
    """
    if count == 0 or split.tp == 1:
        return 0.0
    if split.sp and layer.kind is LayerKind.BLOCK:
        gather = comm.all_gather_time(message, tp_links)
        exposed = count * gather
        hideable = count * (gather + comm.reduce_scatter_time(message, tp_links))
        window = 2 * t.column_gemm_s
    else:
        exposed = 0.0
        hideable = count * comm.all_reduce_time(message, tp_links)
        window = t.column_gemm_s
    if problem.runtime.tp_bwd_overlap:
        hideable = max(0.0, hideable - window)
    return exposed + hideable


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


def _axis_links(problem: Problem, plan: Plan, axis: str) -> GroupLinks:
    """axis_links(), cached per problem (the solver asks for the same groups many times)."""
    key = ("links", getattr(plan, axis), axis_stride(plan, axis))
    links = problem._cache.get(key)
    if links is None:
        links = problem._cache[key] = axis_links(problem.cluster, plan, axis)
    return links


def _replica_links(problem: Problem, plan: Plan) -> GroupLinks:
    """The group that reduces gradients and shards ZeRO states: DP and CP ranks hold the same
    weights, so it spans dp*cp GPUs (Megatron's data-parallel group with CP, torchtitan's
    dp_shard_cp mesh); with the axes adjacent it starts at the inner one's stride."""
    if plan.cp == 1:
        return _axis_links(problem, plan, "dp")
    return _cached_links(problem, plan.dp * plan.cp, _replica_stride(plan))


def _replica_stride(plan: Plan) -> int:
    """Rank distance between neighbouring replicas (DP or CP ranks, whichever is inner)."""
    if plan.cp == 1:
        return axis_stride(plan, "dp")
    return min(axis_stride(plan, "cp"), axis_stride(plan, "dp"))


def _cached_links(problem: Problem, size: int, stride: int) -> GroupLinks:
    key = ("links", "replicas", size, stride)
    links = problem._cache.get(key)
    if links is None:
        links = problem._cache[key] = group_links(problem.cluster, size, stride)
    return links


def _expert_links(problem: Problem, plan: Plan) -> tuple[GroupLinks, GroupLinks]:
    """(EP group, expert-data-parallel group): EP takes the innermost ``ep`` of the dp*cp
    replicas (Megatron's order tp-cp-ep-dp-pp), and the ``dp*cp/ep`` ranks holding the same
    experts, ``ep`` replicas apart, reduce and shard their gradients and states."""
    stride = _replica_stride(plan)
    return (_cached_links(problem, plan.ep, stride),
            _cached_links(problem, plan.dp * plan.cp // plan.ep, stride * plan.ep))


def _rank_stages(plan: Plan, rank: int) -> tuple[tuple[int, int], ...]:
    """The model chunks ``(first_layer, num_layers)`` a pipeline rank runs (chunk c is virtual
    stage c*pp + rank)."""
    layout = plan.layout
    return tuple(layout[c * plan.pp + rank] for c in range(plan.vpp))


@dataclass(frozen=True, slots=True)
class _ChunkSums:
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


def _chunk_compositions(problem: Problem, plan: Plan,
                        stages: tuple[tuple[int, int], ...]) -> tuple:
    """Each chunk as ``((class id, how many, recompute), ...)``.

    With ``recompute_num_layers = N`` a chunk's layers up to its N-th block are fully
    recomputed and the rest keep their activations (Megatron's ``--recompute-method block``:
    the first N transformer layers of every model chunk); layers that are not blocks cost the
    same either way.
    """
    n = plan.recompute_num_layers if plan.recompute is Recompute.FULL else None
    chunks = []
    for first, num in stages:
        cut = num if n is None else _recomputed_prefix(problem, first, num, n)
        rest = Recompute.NONE if n is not None else plan.recompute
        chunks.append(tuple((c, k, plan.recompute) for c, k in problem.layer_counts(first, cut))
                      + tuple((c, k, rest) for c, k in problem.layer_counts(first + cut, num - cut)))
    return tuple(chunks)


def _recomputed_prefix(problem: Problem, first: int, num: int, n: int) -> int:
    """Layers of the chunk ``layers[first:first+num]`` up to and including its n-th block."""
    key = ("prefix", first, num, n)
    cut = problem._cache.get(key)
    if cut is None:
        blocks = [i for i in range(first, first + num)
                  if problem.graph.layers[i].kind is LayerKind.BLOCK]
        cut = problem._cache[key] = num if len(blocks) <= n else blocks[n - 1] + 1 - first
    return cut


def _chunk_sums(problem: Problem, compositions: tuple, split: Split,
                tp_links: GroupLinks, cp_links: GroupLinks) -> _ChunkSums:
    key = ("sums", compositions, split, tp_links, cp_links)
    cached = problem._cache.get(key)
    if cached is not None:
        return cached
    compute_s = backward_s = tp_comm_s = cp_comm_s = wgrad_s = params = acts = working = 0.0
    largest = trained = weight_bytes = 0.0
    gathers = 0
    working_kind = ""
    for composition in compositions:
        for class_id, count, recompute in composition:
            layer = problem.layer_class(class_id)
            cost = _layer_cost(problem, layer, class_id, split, recompute, tp_links, cp_links)
            compute_s += count * cost.compute_s
            backward_s += count * cost.backward_s
            tp_comm_s += count * cost.tp_comm_s
            cp_comm_s += count * cost.cp_comm_s
            wgrad_s += count * cost.wgrad_s
            params += count * cost.params
            trained += count * cost.trained
            weight_bytes += count * cost.weight_bytes
            acts += count * cost.act_bytes
            if cost.working_bytes > working:
                working, working_kind = cost.working_bytes, layer.kind.value
            largest = max(largest, cost.gathered)
            gathers += count * cost.gathers
    sums = _ChunkSums(compute_s, backward_s, tp_comm_s, cp_comm_s, wgrad_s, params,
                      acts / len(compositions), working, largest, gathers, trained, weight_bytes,
                      working_kind)
    problem._cache[key] = sums
    return sums


def _rank_base(problem: Problem, plan: Plan, rank: int, split: Split,
               links: dict[str, GroupLinks], stages: tuple | None = None
               ) -> tuple[_ChunkSums, float, "HeldParams"]:
    """(layer sums, pipeline-send time, parameters held) of a rank running ``stages`` (default:
    its chunks of the plan's layout); shared by equal ranks."""
    stages = stages or _rank_stages(plan, rank)
    key = ("rank", stages, split, plan.recompute, plan.recompute_num_layers, links["tp"],
           links["pp"], links["cp"])
    cached = problem._cache.get(key)
    if cached is None:
        compositions = _chunk_compositions(problem, plan, stages)
        sums = _chunk_sums(problem, compositions, split, links["tp"], links["cp"])
        pp_comm_s = _pp_comm(problem, plan, stages, links["pp"]) if plan.pp > 1 else 0.0
        cached = problem._cache[key] = (sums, pp_comm_s, held_params(problem, plan, sums, stages))
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


def held_params(problem: Problem, plan: Plan, sums: _ChunkSums,
                stages: tuple[tuple[int, int], ...]) -> HeldParams:
    """What a rank's layers hold, plus its copy of tied weights, trained where the layer
    they are tied to (the embedding, layer 0) trains."""
    tied = _tied_copy_params(problem, stages) / plan.tp
    first = problem.graph.layers[0]
    tied_trained = tied * first.trainable_params / first.num_params if first.num_params else 0.0
    return HeldParams(sums.params + tied, sums.trained + tied_trained,
                      sums.weight_bytes + WEIGHT_BYTES * tied)


def _rank_cost(problem: Problem, plan: Plan, rank: int, links: dict[str, GroupLinks],
               stages: tuple | None = None) -> _RankCost:
    split = Split(tp=plan.tp, cp=plan.cp, sp=plan.sequence_parallel, mbs=plan.micro_batch_size,
                  flash=problem.flash_attention)
    sums, pp_comm_s, holds = _rank_base(problem, plan, rank, split, links, stages)
    experts, ep_comm_s = (_rank_experts(problem, plan, rank, split, links, stages)
                          if plan.ep > 1 else (0.0, 0.0))
    holds = holds.without(experts * (plan.ep - 1), experts * (plan.ep - 1))  # 1/ep of experts
    params = holds.count
    states = _model_states(problem, plan, holds.without(experts, experts), experts)
    held = in_flight_chunks(rank, pp=plan.pp, vpp=plan.vpp, num_microbatches=plan.num_microbatches)
    activations = held * sums.acts_per_chunk + sums.working
    other = _other_bytes(problem, plan, activations, sums.largest, params)
    return _RankCost(rank, sums.compute_s + sums.tp_comm_s + sums.cp_comm_s + pp_comm_s + ep_comm_s,
                     sums.compute_s, sums.backward_s, sums.tp_comm_s, sums.cp_comm_s, sums.wgrad_s,
                     pp_comm_s, states, activations, other, params,
                     sums.acts_per_chunk, sums.largest, sums.gathers, ep_comm_s, experts,
                     holds.trained)


def _model_states(problem: Problem, plan: Plan, dense: HeldParams, experts: float) -> ModelStates:
    """Model states of a GPU: the dense parameters sharded over the dp*cp replicas, the experts
    EP split (``experts``, 0 when ep = 1; priced as trained) over the dp*cp/ep ranks that hold
    the same ones."""
    optimizer = problem.training.optimizer
    held = (in_backward_grads_held(problem.graph.layers, plan.tp)
            if problem.training.optimizer_in_backward else None)
    states = model_state_bytes(dense.count, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp,
                               offload=plan.offload, runtime=problem.runtime,
                               trained=dense.trained, weight_bytes=dense.weight_bytes,
                               optimizer=optimizer, grads_held=held)
    if not experts:
        return states
    own = model_state_bytes(experts, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp // plan.ep,
                            offload=plan.offload, runtime=problem.runtime, optimizer=optimizer)
    return ModelStates(states.weights + own.weights, states.gradients + own.gradients,
                       states.optimizer + own.optimizer)


def _rank_experts(problem: Problem, plan: Plan, rank: int, split: Split,
                  links: dict[str, GroupLinks], stages: tuple | None = None
                  ) -> tuple[float, float]:
    """(expert parameters one GPU holds, EP all-to-all seconds per micro-batch) of a rank."""
    stages = stages or _rank_stages(plan, rank)
    key = ("experts", stages, split, plan.ep, plan.recompute, plan.recompute_num_layers,
           links["ep"])
    cached = problem._cache.get(key)
    if cached is None:
        params = seconds = 0.0
        for composition in _chunk_compositions(problem, plan, stages):
            for class_id, count, recompute in composition:
                layer = problem.layer_class(class_id)
                full = recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
                params += count * expert_params(layer) / (plan.tp * plan.ep)
                seconds += count * ep_comm_time(layer, split, links["ep"], full_recompute=full)
        cached = problem._cache[key] = (params, seconds)
    return cached


def _other_bytes(problem: Problem, plan: Plan, activations: float,
                 largest_gathered: float, params: float) -> float:
    """Memory besides model states and activations: outside the allocator the CUDA context and
    NCCL buffers, the allocator's slack (memory.allocator_slack_bytes), a ZeRO optimizer's
    gradient-reduction bucket (DeepSpeed allocates it whole), and with ZeRO-3 the
    unsharded copies of the gathered units (memory.zero3_buffer_bytes) of a GPU holding
    ``params`` parameters."""
    runtime = problem.runtime
    other = runtime.cuda_context_bytes + allocator_slack_bytes(activations, runtime.fragmentation,
                                                                runtime.cublas_workspace_bytes)
    if plan.zero_stage >= 1:
        other += runtime.zero_bucket_bytes
    if plan.zero_stage >= 3:
        other += zero3_buffer_bytes(
            largest_gathered, params, bytes_per_param=runtime.zero3_gather_bytes,
            pipeline_resident=runtime.zero3_pp_resident and plan.pp > 1)
    return other


def _tied_copy_params(problem: Problem, stages: tuple[tuple[int, int], ...]) -> float:
    """Weights tied to an earlier layer (the LM head to the embedding) that a pipeline rank
    runs apart from that layer: Megatron keeps a copy on the rank that runs the tied layer
    (the last stage's, or the one before a stage of the loss alone), none when the same rank
    also runs layer 0."""
    if any(first == 0 for first, _ in stages):
        return 0.0
    return sum(problem.layer_class(c).tied_params * k
               for first, num in stages for c, k in problem.layer_counts(first, num))


def _pp_comm(problem: Problem, plan: Plan, stages: tuple, links: GroupLinks) -> float:
    """Activation sends forward and gradient sends backward, per micro-batch, for each chunk."""
    layers = problem.graph.layers
    total = 0.0
    for start, num in stages:
        first, last = layers[start], layers[start + num - 1]
        boundary = max(first.input_bytes, last.boundary_bytes)
        message = boundary * plan.micro_batch_size / plan.cp
        if problem.runtime.pp_scatter_gather and plan.tp > 1:
            message /= plan.tp
        total += 2 * comm.p2p_time(message, links)
    return total


def _overlapped(comm_s: float, compute_s: float, overlap: float) -> float:
    """Exposed part of communication that can run under ``compute_s`` of computation, when a
    fraction ``overlap`` of the shorter of the two is hidden."""
    return comm_s - overlap * min(comm_s, compute_s)


ZERO3_PASSES = 3
"""ZeRO-3 collectives per gather unit and micro-batch: the weights are gathered for the forward
and again for the backward (with its recompute), and the gradients reduce-scattered (3x the
model bytes, Rajbhandari et al. 2020)."""


def _dp_time(problem: Problem, plan: Plan, params: float, links: GroupLinks,
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
    after the step; ZeRO-3 gathers every weight.
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
    return _overlapped(plan.num_microbatches * sync, compute_s, runtime.zero3_overlap)


def _dp_collectives(problem: Problem, plan: Plan, params: float, trained: float,
                    links: GroupLinks, gathers: int) -> float:
    """Seconds of the data-parallel collectives over ``links`` for ``params`` parameters,
    ``trained`` of them with gradients: per step below ZeRO-3, per micro-batch with ZeRO-3."""
    runtime = problem.runtime
    grads = runtime.grad_bytes * trained
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


def _optimizer_time(problem: Problem, plan: Plan, params: float, experts: float = 0.0) -> float:
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


def _offload_param_time(problem: Problem, plan: Plan, params: float) -> float:
    """ZeRO-3 parameter offload fetches the weights over PCIe for every forward and backward."""
    if plan.offload is not Offload.PARAMS:
        return 0.0
    return plan.num_microbatches * 2 * WEIGHT_BYTES * params / _host_link(problem)


def model_flops_per_sample(graph: LayerGraph) -> float:
    """Model FLOPs (MFU basis): forward + backward, attention backward counted as 2x forward
    (Korthikanti et al. 2022 eq. 7), no recomputation."""
    total = graph.fwd_flops + graph.bwd_flops
    for layer in graph.layers:
        for att in layer.attention:
            total -= att.bwd_flops - 2 * att.fwd_flops
    return total


def hardware_flops_per_sample(graph: LayerGraph, recompute: Recompute,
                              recomputed: frozenset[int] | None = None) -> float:
    """FLOPs actually executed: model FLOPs plus the recomputed forward; ``recomputed`` lists
    the fully recomputed layers when not every block is (``recompute_num_layers``)."""
    extra = 0.0
    for index, layer in enumerate(graph.layers):
        if (recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
                and (recomputed is None or index in recomputed)):
            extra += layer.fwd_flops
        elif recompute is Recompute.SELECTIVE:
            extra += sum(a.fwd_flops for a in layer.attention)
    return model_flops_per_sample(graph) + extra


def _recomputed_layers(problem: Problem, plan: Plan) -> frozenset[int] | None:
    """Indices of the fully recomputed layers under ``recompute_num_layers`` (None: all)."""
    if plan.recompute_num_layers is None:
        return None
    return frozenset(i for first, num in plan.layout for i in range(
        first, first + _recomputed_prefix(problem, first, num, plan.recompute_num_layers)))


def _rank_groups(problem: Problem, plan: Plan) -> list[list[int]]:
    """Pipeline ranks grouped by what they run (same layers, same boundaries): a balanced
    pipeline has a handful of groups however deep it is, and equal ranks cost the same."""
    key = ("groups", plan.layout, plan.pp, plan.vpp, plan.recompute, plan.recompute_num_layers)
    groups = problem._cache.get(key)
    if groups is None:
        by_signature: dict[tuple, list[int]] = {}
        end = len(problem.graph.layers)
        for rank in range(plan.pp):
            stages = _rank_stages(plan, rank)
            signature = (rank == plan.pp - 1,) + _chunk_compositions(problem, plan, stages) + tuple(
                (first == 0, first + num == end) for first, num in stages)
            by_signature.setdefault(signature, []).append(rank)
        groups = problem._cache[key] = list(by_signature.values())
    return groups


def _deferred_share(plan: Plan, costs: list[_RankCost]) -> float:
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
    costs: list[_RankCost]

    @property
    def slowest(self) -> _RankCost:
        return max(self.costs, key=lambda c: c.micro_batch_s)

    @property
    def peak_memory_bytes(self) -> float:
        """The first rank of each group holds the most micro-batches in flight."""
        return max(c.memory for c in self.costs)


def _plan_links(problem: Problem, plan: Plan) -> dict[str, GroupLinks]:
    """The links of each of the plan's groups; "dp" is the gradient-reduction group."""
    links = {axis: _axis_links(problem, plan, axis) for axis in ("tp", "cp", "pp")}
    links["dp"] = _replica_links(problem, plan)
    if plan.ep > 1:
        links["ep"], links["expert_dp"] = _expert_links(problem, plan)
    return links


def _evaluate(problem: Problem, plan: Plan) -> _Evaluation:
    links = _plan_links(problem, plan)
    groups = _rank_groups(problem, plan)
    costs = [_rank_cost(problem, plan, ranks[0], links) for ranks in groups]
    slowest = max(c.micro_batch_s for c in costs)
    total = sum(c.micro_batch_s * len(ranks) for ranks, c in zip(groups, costs))
    m = plan.num_microbatches
    pipe = pipeline_time(slowest_s=slowest, total_s=total, num_microbatches=m, vpp=plan.vpp,
                         deferred_share=_deferred_share(plan, costs))
    params = max(c.params for c in costs)
    trained = max(c.trained for c in costs)
    experts = max(c.expert_params for c in costs)
    slow = max(costs, key=lambda c: c.micro_batch_s)
    dp_s = _dp_time(problem, plan, params, links["dp"], backward_s=slow.backward_s,
                    compute_s=m * slow.compute_s, gathers=slow.gathers,
                    experts=(experts, links["expert_dp"]) if experts else None, trained=trained)
    opt_s = (_optimizer_time(problem, plan, trained, experts)
             + _offload_param_time(problem, plan, params))
    return _Evaluation(pipe + dp_s + opt_s, pipe, dp_s, opt_s, groups, costs)


@dataclass(frozen=True, slots=True)
class RankProfile:
    """One pipeline rank's share of a step: what the partition model tabulates."""

    micro_batch_s: float
    after_s: float
    """Its gradient reduction and optimizer step, as if it were the plan's slowest rank."""
    memory_bytes: float


def rank_profile(problem: Problem, plan: Plan, rank: int, stage: tuple[int, int]) -> RankProfile:
    """Costs of pipeline rank ``rank`` running the one chunk ``stage = (first, num)`` under the
    plan's degrees and switches (``plan``'s own stages are not read): the terms ``_evaluate``
    takes the max or sum of over ranks."""
    links = _plan_links(problem, plan)
    cost = _rank_cost(problem, plan, rank, links, (stage,))
    experts = cost.expert_params
    sync_s = _dp_time(problem, plan, cost.params, links["dp"], backward_s=cost.backward_s,
                      compute_s=plan.num_microbatches * cost.compute_s, gathers=cost.gathers,
                      experts=(experts, links["expert_dp"]) if experts else None,
                      trained=cost.trained)
    optimizer_s = (_optimizer_time(problem, plan, cost.trained, experts)
                   + _offload_param_time(problem, plan, cost.params))
    return RankProfile(cost.micro_batch_s, sync_s + optimizer_s, cost.memory)


def pipeline_total_s(problem: Problem, plan: Plan) -> float:
    """Sum over the pipeline ranks of their micro-batch times (the ``total_s`` of
    ``pipeline_time``)."""
    evaluation = _evaluate(problem, plan)
    return sum(c.micro_batch_s * len(ranks) for ranks, c in zip(evaluation.groups,
                                                                  evaluation.costs))


def step_and_peak(problem: Problem, plan: Plan) -> tuple[float, float]:
    """(step seconds, worst-GPU bytes): exactly what estimate() reports, without the detail,
    for the solver's tables."""
    if plan.stage_groups is not None:
        from autoplan.costmodels.groups import step_and_peak_on_groups  # it builds on this module
        return step_and_peak_on_groups(problem, plan)
    evaluation = _evaluate(problem, plan)
    return evaluation.step_s, evaluation.peak_memory_bytes


def _rank_memories(problem: Problem, plan: Plan, evaluation: _Evaluation) -> list[float]:
    """Memory of every rank: within a group only the micro-batches held in flight differ."""
    memories = [0.0] * plan.pp
    for ranks, cost in zip(evaluation.groups, evaluation.costs):
        first = in_flight_chunks(cost.rank, pp=plan.pp, vpp=plan.vpp,
                                 num_microbatches=plan.num_microbatches)
        for rank in ranks:
            held = in_flight_chunks(rank, pp=plan.pp, vpp=plan.vpp,
                                    num_microbatches=plan.num_microbatches)
            activations = cost.activations + (held - first) * cost.acts_per_chunk
            memories[rank] = (cost.states.total + activations
                              + _other_bytes(problem, plan, activations, cost.largest,
                                             cost.params))
    return memories


def peak_moments(problem: Problem, plan: Plan) -> list[str]:
    """For each pipeline rank, the moment of the step that sets its memory peak: the
    micro-batches it holds in flight (its schedule's warm-up) when its largest transient runs,
    the cross-entropy of the logits or the backward of its heaviest layer (a full-recompute
    block rebuilding its activations), with ZeRO-3's gathered copies held meanwhile."""
    moments = [""] * plan.pp
    links = _plan_links(problem, plan)
    for ranks in _rank_groups(problem, plan):
        for rank in ranks:
            split = Split(tp=plan.tp, cp=plan.cp, sp=plan.sequence_parallel,
                          mbs=plan.micro_batch_size, flash=problem.flash_attention)
            sums = _rank_base(problem, plan, rank, split, links)[0]
            held = in_flight_chunks(rank, pp=plan.pp, vpp=plan.vpp,
                                    num_microbatches=plan.num_microbatches)
            what = ("the loss (cross-entropy over the logits) of the newest micro-batch"
                    if sums.working_kind == "loss" else f"the backward of a {sums.working_kind}"
                    if sums.working_kind else "the backward")
            moments[rank] = f"{what}, with {held} micro-batch chunk(s) of activations in flight"
    return moments


def lower_bound_s(problem: Problem) -> float:
    """A step time no plan can beat under this cost model: the model's FLOPs spread over every
    GPU of the cluster at the best efficiency any kernel reaches, with nothing else (each
    group's GPUs at their own rate on a heterogeneous cluster)."""
    samples = problem.training.global_batch
    if problem.cluster.is_homogeneous:
        rate = problem.cluster.num_gpus * _best_rate(problem)
    else:
        rate = sum(g.num_gpus * _best_rate(problem.on_group(g.name)) for g in problem.cluster.groups)
    return model_flops_per_sample(problem.graph) * samples / rate


def _best_rate(problem: Problem) -> float:
    """FLOP/s of one GPU at the best efficiency any kernel reaches."""
    return problem.cluster.gpu.peak_flops(problem.precision) * max(
        problem.compute.gemm_efficiency, problem.compute.attention_efficiency)


def shape_lower_bound_s(problem: Problem, *, tp: int, pp: int, cp: int, mbs: int, vpp: int,
                        num_microbatches: int, zero_bubble: bool = False) -> float:
    """A step time no plan of this shape can beat, whatever its stages and switches.

    Every layer runs once per micro-batch on some pipeline rank, so the ranks' micro-batch
    times sum to at least S, the layers' compute and TP collectives without recomputation
    (the cheaper of with and without SP); the slowest rank takes at least S / pp, and the
    schedule ``m * max + (sum - max) / v`` is then at least ``(m - 1/v) S / pp + S / v``
    (``m S / pp`` under a ``zero_bubble`` schedule, which may hide all of its fill and drain).
    Pipeline sends, ring attention, data-parallel reduction and the optimizer only add time.
    """
    key = ("shape-bound", tp, cp, mbs)
    per_microbatch = problem._cache.get(key)
    if per_microbatch is None:
        links = (group_links(problem.cluster, tp, 1),  # TP innermost: its fastest links
                 group_links(problem.cluster, cp, tp))  # (ring attention is left out)
        counts = problem.layer_counts(0, len(problem.graph.layers))
        per_microbatch = min(
            sum(k * _layer_time_and_tp_comm(problem, c, Split(tp=tp, cp=cp, sp=sp, mbs=mbs,
                                                               flash=problem.flash_attention),
                                            *links) for c, k in counts)
            for sp in ((False, True) if tp > 1 else (False,)))
        problem._cache[key] = per_microbatch
    m = num_microbatches
    if zero_bubble:
        return m * per_microbatch / pp
    return (m - 1 / vpp) * per_microbatch / pp + per_microbatch / vpp


def _layer_time_and_tp_comm(problem: Problem, class_id: int, split: Split,
                            tp_links: GroupLinks, cp_links: GroupLinks) -> float:
    cost = _layer_cost(problem, problem.layer_class(class_id), class_id, split, Recompute.NONE,
                       tp_links, cp_links)
    return cost.compute_s + cost.tp_comm_s


def estimate(problem: Problem, plan: Plan) -> Estimate:
    """Predicted step time and worst-GPU memory of ``plan`` on ``problem``."""
    if plan.stage_groups is not None:
        from autoplan.costmodels.groups import estimate_on_groups  # it builds on this module
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
    return _summarize(problem, plan, step=evaluation.step_s, worst=worst,
                      memories=_rank_memories(problem, plan, evaluation), breakdown=breakdown)


def _summarize(problem: Problem, plan: Plan, *, step: float, worst: _RankCost,
               memories: list[float], breakdown: dict[str, float]) -> Estimate:
    samples = plan.global_batch_size
    peak = problem.cluster.gpu.peak_flops(problem.precision)
    flops_key = ("flops", plan.recompute, plan.recompute_num_layers,
                 plan.layout if plan.recompute_num_layers else None)
    if flops_key not in problem._cache:
        problem._cache[flops_key] = (model_flops_per_sample(problem.graph),
                                     hardware_flops_per_sample(problem.graph, plan.recompute,
                                                               _recomputed_layers(problem, plan)))
    model_flops, hardware_flops = problem._cache[flops_key]
    model_tflops = model_flops * samples / (plan.world_size * step) / 1e12
    hw = hardware_flops * samples
    return Estimate(
        step_time_s=step,
        tokens_per_s=samples * problem.graph.seq_len / step,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw / (plan.world_size * step) / 1e12,
        mfu=model_tflops * 1e12 / peak,
        peak_memory_gib=worst.memory / GIB,
        peak_allocated_gib=(worst.memory - problem.runtime.cuda_context_bytes
                            - allocator_slack_bytes(worst.activations,
                                                    problem.runtime.fragmentation,
                                                    problem.runtime.cublas_workspace_bytes)) / GIB,
        peak_reserved_gib=(worst.memory - problem.runtime.cuda_context_bytes) / GIB,
        memory_limit_gib=problem.mem_limit_bytes / GIB,
        memory_breakdown_gib={
            "weights": worst.states.weights / GIB, "gradients": worst.states.gradients / GIB,
            "optimizer": worst.states.optimizer / GIB, "activations": worst.activations / GIB,
            "other": worst.other / GIB,
        },
        time_breakdown_s=breakdown,
        stage_memory_gib=tuple(m / GIB for m in memories),
        feasible=worst.memory <= problem.mem_limit_bytes,
    )
