"""One layer's per-micro-batch costs on one GPU under a split and recompute: compute, exposed TP
and CP communication, kept and working activation bytes, parameters held and gathered."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.costmodels import comm, tp_overlap
from autoplan.costmodels.compute import LayerTime, Split, layer_time, linear_time
from autoplan.costmodels.context import ring_attention_time
from autoplan.costmodels.fp8 import linear_rate, weight_workspace_bytes
from autoplan.costmodels.fused_kernels import block_traffic
from autoplan.costmodels.memory import (
    WEIGHT_BYTES,
    backward_working_bytes,
    cross_entropy_bytes_per_logit,
    held_fp32_logits_bytes,
    layer_activation_bytes,
    layer_params_on_gpu,
    layer_trained_on_gpu,
    layer_weight_bytes,
    loss_peak_bytes,
    replaced_output_bytes,
)
from autoplan.costmodels.problem import Problem, memo
from autoplan.costmodels.saved_activations import megatron_saved_layer

from autoplan.cluster.topology import GroupLinks
from autoplan.graph.layer_graph import Gemm, Layer, LayerKind, TpSplit
from autoplan.plan import Recompute


@dataclass(frozen=True, slots=True)
class LayerCost:
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
    fp8_workspace_bytes: float = 0.0  # TE's cached FP8 weights where not FP8 params (fp8.py)


def _tp_messages(layer: Layer, split: Split) -> tuple[int, int, float]:
    """(forward all-reduces, backward all-reduces, message bytes) per micro-batch; with SP
    each stands for the collectives of :func:`_tp_forward_collective` (the head's forward:
    the all-gather of its sequence-sharded input)."""
    size = split.mbs / split.cp
    if layer.kind is LayerKind.BLOCK:
        return layer.tp_allreduces, layer.tp_allreduces, layer.boundary_bytes * size
    if layer.kind is LayerKind.HEAD:
        return int(split.sp), 1, layer.input_bytes * size
    return layer.tp_allreduces, 0, layer.boundary_bytes * size


def layer_cost(problem: Problem, layer: Layer, class_id: int, split: Split,
                recompute: Recompute, tp_links: GroupLinks, cp_links: GroupLinks) -> LayerCost:
    key = (class_id, split, recompute, tp_links, cp_links)
    cached = memo(problem).get(key)
    if cached is not None:
        return cached
    frozen_dtype = problem.training.frozen_storage
    op_sac = problem.runtime.selective_recompute == "op"
    runtime = problem.runtime
    compiled = runtime.compiled_elementwise_fraction if runtime.compile else None
    kernels = block_traffic(problem.graph, layer, runtime.transformer_impl, problem.precision)
    t = layer_time(layer, split, recompute, gpu=problem.cluster.gpu, precision=problem.precision,
                   profile=problem.compute, frozen_dtype=frozen_dtype, op_sac=op_sac,
                   compiled_fraction=compiled, kernels=kernels,
                   casts_fp8_weights=not runtime.fp8_weight_cache)
    fwd_n, bwd_n, message = _tp_messages(layer, split)
    full = recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK
    regions = _userbuffers_regions(problem, layer, split, message, tp_links)
    if regions is None:
        one = _tp_forward_collective(layer, split, message, tp_links)
        bwd_comm = _tp_backward_comm(problem, layer, split, t, bwd_n, message, tp_links)
    else:  # fwd_n = bwd_n = len(regions): one's mean over the regions
        cfg, sms = problem.runtime.tp_comm_overlap_cfg, problem.cluster.gpu.sm_count
        one = sum(tp_overlap.exposed_forward_s(r, split.tp, cfg, sms) for r in regions) / fwd_n
        bwd_comm = sum(tp_overlap.exposed_backward_s(r, split.tp, cfg, sms) for r in regions)
    tp_comm = fwd_n * one * (2 if full else 1) + bwd_comm
    cost = LayerCost(
        compute_s=t.fwd_s + t.bwd_s + t.recompute_s, backward_s=t.bwd_s + t.recompute_s,
        tp_comm_s=tp_comm,
        cp_comm_s=ring_attention_time(layer, split, t, cp_links,
                                      recomputed=full or (recompute is Recompute.SELECTIVE
                                                          and not op_sac)),
        wgrad_s=t.wgrad_s,
        act_bytes=_kept_bytes(problem, layer, split, recompute),
        working_bytes=_working_bytes(problem, layer, split),
        params=layer_params_on_gpu(layer, split.tp),
        gathered=_gathered_params(problem, layer, split.tp), gathers=_gather_units(problem, layer),
        trained=layer_trained_on_gpu(layer, split.tp),
        weight_bytes=layer_weight_bytes(layer, split.tp, frozen_dtype),
        fp8_workspace_bytes=weight_workspace_bytes(layer, split.tp, problem.precision,
                                                   runtime.fp8_weight_cache),
    )
    memo(problem)[key] = cost
    return cost


def _tp_forward_collective(layer: Layer, split: Split, message: float,
                           tp_links: GroupLinks) -> float:
    """Seconds of the TP collectives that stand for one forward all-reduce of ``layer``.

    Without SP, one all-reduce (NCCL may run it as a tree across nodes). With SP
    (Korthikanti et al. 2022 sec. 4.2.2; megatron-core's ColumnParallelLinear and
    RowParallelLinear with sequence_parallel, as nanotron's REDUCE_SCATTER mode does) a block's
    row-parallel Linear reduce-scatters its output and the next column-parallel Linear
    all-gathers its input: two rings of n - 1 steps, two launches, and no tree (NCCL runs
    neither collective as one). The vocab-parallel embedding reduce-scatters its output
    (reduce_scatter_to_sequence_parallel_region) and the output layer, a column-parallel
    Linear, all-gathers its input."""
    if split.tp == 1:
        return 0.0
    if not split.sp:
        return comm.all_reduce_time(message, tp_links)
    if layer.kind is LayerKind.HEAD:
        return comm.all_gather_time(message, tp_links)
    scatter = comm.reduce_scatter_time(message, tp_links)
    if layer.kind is LayerKind.BLOCK:
        return comm.all_gather_time(message, tp_links) + scatter
    return scatter


def _userbuffers_regions(problem: Problem, layer: Layer, split: Split, message: float,
                         tp_links: GroupLinks) -> list[tp_overlap.Region] | None:
    """A block's TP regions as Transformer Engine's userbuffers overlap them
    (costmodels.tp_overlap), or None where they do not: the runtime without
    ``tp_comm_overlap``, no SP, not a block (Megatron's embedding and output layer are not TE
    modules), a TP group across nodes, or Linears that do not form the attention and MLP
    regions (column-parallel ones, then one row-parallel, each applied once)."""
    if not (problem.runtime.tp_comm_overlap and split.sp and split.tp > 1
            and layer.kind is LayerKind.BLOCK and tp_links.num_nodes == 1
            and problem.cluster.gpu.sm_count):
        return None
    grouped = _column_row_regions(layer)
    if grouped is None:
        return None
    gpu = problem.cluster.gpu
    rate = linear_rate(layer, gpu, problem.precision, problem.compute)

    def seconds(gemms, peak: float) -> float:
        return sum(linear_time(g, split, gpu, peak, problem.compute, rate.operand_bytes)
                   for g in gemms)

    gather = comm.all_gather_time(message, tp_links)
    scatter = comm.reduce_scatter_time(message, tp_links)
    return [tp_overlap.Region(gather, scatter, seconds(columns, rate.forward_peak),
                              seconds([row], rate.forward_peak),
                              seconds(columns, rate.backward_peak),
                              seconds([row], rate.backward_peak), names)
            for (columns, row), names in zip(grouped, tp_overlap.REGION_OPS)]


def _column_row_regions(layer: Layer) -> list[tuple[list[Gemm], Gemm]] | None:
    """The block's Linears in forward order cut after each row-parallel one, if they form
    exactly the attention and MLP regions of :data:`tp_overlap.REGION_OPS`."""
    regions, columns = [], []
    for gemm in layer.gemms:
        if gemm.count != 1 or gemm.adapter:
            return None
        if gemm.split is TpSplit.COLUMN:
            columns.append(gemm)
        elif gemm.split is TpSplit.ROW:
            if not columns:
                return None
            regions.append((columns, gemm))
            columns = []
    if columns or len(regions) != len(tp_overlap.REGION_OPS):
        return None
    return regions


def layer_memory_bytes(problem: Problem, layer: Layer, split: Split,
                       recompute: Recompute) -> tuple[float, float]:
    """(kept, working) bytes of a layer per micro-batch on one GPU, as ``layer_cost`` prices
    them, without its time terms (the step replay's per-layer tensors)."""
    return _kept_bytes(problem, layer, split, recompute), _working_bytes(problem, layer, split)


def _kept_bytes(problem: Problem, layer: Layer, split: Split, recompute: Recompute) -> float:
    """What a layer keeps for backward per micro-batch. The cross-entropy of the logits keeps
    nothing across micro-batches: each one's backward starts right after its loss."""
    if logits_layer(problem, layer) is not None:
        return 0.0
    return layer_activation_bytes(_as_saved(problem, layer), split, recompute,
                                  op_sac=problem.runtime.selective_recompute == "op",
                                  gathered_inputs=problem.runtime.sp_saves_gathered_input)


def _working_bytes(problem: Problem, layer: Layer, split: Split) -> float:
    """Transient bytes of a layer's backward; for the loss, the runtime's cross-entropy."""
    head = logits_layer(problem, layer)
    if head is None:
        return backward_working_bytes(_as_saved(problem, layer), split,
                                      gathered_inputs=problem.runtime.sp_saves_gathered_input)
    element = 4 if problem.precision == "fp32" else WEIGHT_BYTES
    peak = loss_peak_bytes(head.boundary_bytes, split,
                           bytes_per_logit=cross_entropy_bytes_per_logit(problem.runtime,
                                                                         split.tp),
                           logit_element_bytes=element)
    if problem.runtime.pp_holds_stage_outputs:  # counted with the held stage output
        held = held_fp32_logits_bytes(head.boundary_bytes, split, logit_element_bytes=element)
        cast = head.boundary_bytes * split.mbs / (split.tp * split.cp) if element < 4 else 0.0
        return max(peak - held, replaced_output_bytes(held, cast))
    return peak


def _as_saved(problem: Problem, layer: Layer) -> Layer:
    """The layer with what the runtime's block implementation saves for backward
    (saved_activations.py: megatron-core with Transformer Engine), else as traced. Kept per
    problem by the layer's identity (the entry holds the layer, so no other object takes its
    id), since the search asks for each layer class of every stage it prices."""
    key = ("as saved", id(layer))
    found = memo(problem).get(key)
    if found is None:
        found = memo(problem)[key] = (layer, megatron_saved_layer(
            problem.graph, layer, problem.runtime.transformer_impl, problem.precision))
    return found[1]


def logits_layer(problem: Problem, layer: Layer) -> Layer | None:
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
    else:  # the head's input gradient: reduce-scattered back to the sequence shards with SP
        exposed = 0.0
        reduce = comm.reduce_scatter_time if split.sp else comm.all_reduce_time
        hideable = count * reduce(message, tp_links)
        window = t.column_gemm_s
    if problem.runtime.tp_bwd_overlap:
        hideable = max(0.0, hideable - window)
    return exposed + hideable
