"""Memory per GPU: model states by ZeRO stage and offload, activations by recompute, TP/SP/CP
and the micro-batches a pipeline schedule keeps in flight, plus a stated allowance.

Model states (Rajbhandari et al. 2020, ZeRO; Megatron-LM distributed optimizer docs), bytes per
parameter held by a GPU with d-way data parallelism, bf16 weights, Adam with fp32 master
weights and moments (``K = master + moments = 12``):
    stage 0: 2 + g + K          stage 1: 2 + g + K/d
    stage 2: 2 + (g + K)/d      stage 3: (2 + g + K)/d
where g is the runtime's gradient bytes (2 in DeepSpeed, 4 for Megatron's fp32 main grads).
DeepSpeed's ZeRO optimizers also keep an fp32 gradient partition with the optimizer state
(``fp32_grad_bytes``; 2 + 18/d for ZeRO-2 in its own estimators).
Frozen parameters (``requires_grad=False``) keep only their weights, stored in the frozen
dtype (quantization.py): no gradient, no fp32 master, no optimizer state, since every runtime
builds its gradient buffers and optimizer from the parameters that require grad (Megatron's
DistributedOptimizer and DeepSpeed's ZeRO filter on it; FSDP's optimizer gets
``filter(requires_grad)``). ZeRO-3/FSDP shard the frozen weights like the others. The
optimizer's state per trained parameter: Adam(W) two fp32 moments (8 bytes); bitsandbytes'
8-bit Adam two uint8 states with one fp32 absmax each per block of 256 (2 + 8/256 bytes,
``Optimizer8bit.init_state``); SGD with momentum one fp32 buffer (4 bytes).
The allocated peak is the largest of three moments: the backward (states, activations in
flight, the largest transient), the end of a micro-batch's backward (one micro-batch fewer in
flight, the largest gradient's copy as it is accumulated: ``upcast_grad_moment_bytes``) and the
gradient reduction and optimizer step (states and their transients, the activations freed).
What the caching allocator reserves on top comes from replaying the step's allocations
(costmodels/step_allocations.py): the step's transients that no cached activation block
serves take new segments above the backward's.
Activations per layer come from the trace (bytes saved for backward), split by TP where the
tensor lies between a column- and a row-parallel Linear and by SP elsewhere (Korthikanti et al.
2022, Table 2); full recompute keeps only each layer's input.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autoplan.costmodels.compute import Split
from autoplan.costmodels.fused_softmax import EAGER_SAVED_BYTES, EAGER_WORKING_SHAPES
from autoplan.costmodels.pipeline import warmup_forwards
from autoplan.costmodels.profiles import RuntimeProfile
from autoplan.costmodels.quantization import quantized_gemms, stored_bytes_per_param
from autoplan.graph.layer_graph import Layer, LayerKind, TpSplit
from autoplan.plan import Offload, Recompute
from autoplan.training import FrozenDtype, Optimizer

WEIGHT_BYTES = 2
"""bf16/fp16 working copy of the weights."""

FP32_BYTES = 4

SCORE_BYTES_WITH_DROPOUT = 5
"""Explicit attention keeps softmax output (2), dropout mask (1) and dropout output (2) per
score element (Korthikanti et al. 2022, the 5as/h term)."""

SCORE_BYTES_NO_DROPOUT = 2

ADAM8BIT_BLOCK = 256
OPTIMIZER_STATE_BYTES = {
    Optimizer.ADAMW8BIT: 2 + 2 * 4 / ADAM8BIT_BLOCK,  # two uint8 states, an fp32 absmax each
    Optimizer.SGD: 4,  # one fp32 momentum buffer
}
"""State bytes per trained parameter besides the fp32 master (Adam(W): the runtime's
``moment_bytes``)."""


def optimizer_state_bytes(optimizer: Optimizer, runtime: RuntimeProfile) -> float:
    """Bytes of optimizer state per trained parameter, without the master copy."""
    return OPTIMIZER_STATE_BYTES.get(optimizer, runtime.moment_bytes)


def optimizer_step_bytes(optimizer: Optimizer, runtime: RuntimeProfile) -> float:
    """HBM traffic of the optimizer step per trained parameter besides the gradient: read and
    write the master and the states, write the 2-byte weight (26 for mixed-precision Adam)."""
    return 2 * (runtime.master_bytes + optimizer_state_bytes(optimizer, runtime)) + WEIGHT_BYTES



@dataclass(frozen=True, slots=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer state on one GPU."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(num_params: float, *, zero_stage: int, dp: int, offload: Offload,
                      runtime: RuntimeProfile, trained: float | None = None,
                      weight_bytes: float | None = None,
                      optimizer: Optimizer = Optimizer.ADAMW,
                      grads_held: float | None = None) -> ModelStates:
    """Model-state bytes on one GPU holding ``num_params`` parameters (before ZeRO sharding),
    ``trained`` of them requiring grad (default: all), whose weights take ``weight_bytes`` as
    stored (default: 2 bytes each). ``grads_held``: the trained parameters whose gradients
    exist at once (default: all trained, kept until the optimizer step; with the optimizer in
    backward, the largest layer's: :func:`in_backward_grads_held`)."""
    trained = num_params if trained is None else trained
    grads_held = trained if grads_held is None else grads_held
    weight_bytes = WEIGHT_BYTES * num_params if weight_bytes is None else weight_bytes
    optimizer_per_param = runtime.master_bytes + optimizer_state_bytes(optimizer, runtime)
    shard = dp if zero_stage >= 1 else 1
    weights = weight_bytes / (dp if zero_stage >= 3 else 1)
    gradients = runtime.grad_bytes * grads_held / (dp if zero_stage >= 2 else 1)
    optimizer = optimizer_per_param * trained / shard
    if offload is not Offload.NONE:
        optimizer = 0.0
    else:
        gradients += runtime.fp32_grad_bytes * grads_held / shard
    if offload is Offload.PARAMS:
        weights = 0.0
    return ModelStates(weights, gradients, optimizer)


def layer_params_on_gpu(layer: Layer, tp: int) -> float:
    """Parameters of a layer one TP rank holds."""
    return layer.params_sharded / tp + layer.params_replicated


def layer_trained_on_gpu(layer: Layer, tp: int) -> float:
    """Trainable parameters of a layer one TP rank holds."""
    replicated = layer.trainable_params - layer.trainable_sharded
    return layer.trainable_sharded / tp + replicated


def in_backward_grads_held(layers: Iterable[Layer], tp: int) -> float:
    """Trained parameters whose gradients one GPU holds at once when the optimizer steps in
    backward: the largest layer's. torchtune's ``optimizer_in_bwd`` registers a
    ``register_post_accumulate_grad_hook`` per parameter that steps that parameter's optimizer
    and sets its ``.grad`` to None, so a gradient lives from its accumulation to its hook;
    FSDP2 reduce-scatters a unit's (layer's) gradients together and then runs the hooks of
    its sharded parameters (torch ``_fsdp_collectives.foreach_reduce``), so the gradients of
    one layer are alive at once, not the whole model's."""
    return max((layer_trained_on_gpu(layer, tp) for layer in layers), default=0.0)


def layer_weight_bytes(layer: Layer, tp: int, frozen_dtype: FrozenDtype) -> float:
    """Bytes of a layer's weights on one TP rank: 2 per parameter, but the frozen Linears a
    quantized base stores in its format (quantization.py)."""
    total = WEIGHT_BYTES * layer_params_on_gpu(layer, tp)
    for gemm in quantized_gemms(layer):
        params = gemm.weight_params / (tp if gemm.split is not TpSplit.NONE else 1)
        total -= params * (WEIGHT_BYTES - stored_bytes_per_param(frozen_dtype, gemm.in_features))
    return total


def _score_bytes(layer: Layer, split: Split) -> float:
    """Explicit (non-flash) attention's s x s tensors per micro-batch: where the fused softmax
    does not run, its eager fallback keeps fp32 probabilities (costmodels.fused_softmax), and
    without dropout the 16-bit ones the second batched GEMM saves besides."""
    total = 0.0
    for att in layer.attention:
        per_element = SCORE_BYTES_WITH_DROPOUT if att.dropout > 0 else SCORE_BYTES_NO_DROPOUT
        if not split.softmax_fused(att):
            per_element += EAGER_SAVED_BYTES - (WEIGHT_BYTES if att.dropout > 0 else 0)
        total += per_element * att.num_heads * att.seq_len * att.seq_len
    return total * split.mbs / (split.tp * split.cp * split.cp)


def layer_activation_bytes(layer: Layer, split: Split, recompute: Recompute, *,
                           op_sac: bool = False, gathered_inputs: bool = False) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one GPU. ``op_sac``: selective
    recompute is torchtitan's op-level checkpointing rather than Megatron's core-attention
    recompute. ``gathered_inputs``: under SP the column-parallel Linears save the input they
    all-gathered, whole (DTensor's ``Shard(1) -> Replicate`` before them, as torchtitan runs
    it), not the 1/tp shard Megatron keeps and re-gathers in backward. None before the first
    trainable parameter: such a layer has no backward."""
    if not layer.in_backward:
        return 0.0
    replicated_div = split.tp if split.sp else 1
    if recompute is Recompute.FULL and layer.kind is LayerKind.BLOCK:
        return layer.input_bytes * split.mbs / (split.cp * replicated_div)
    if recompute is Recompute.SELECTIVE and op_sac and layer.op_sac_bytes is not None:
        return op_sac_block_bytes(layer, split)
    kept = layer.activation_bytes_sharded / split.tp + layer.activation_bytes_replicated / replicated_div
    if gathered_inputs and split.sp and split.tp > 1:
        kept += layer.column_input_bytes * (1 - 1 / split.tp)
    kept *= split.mbs / split.cp
    if recompute is Recompute.SELECTIVE:
        return kept
    if not split.flash:
        return kept + _score_bytes(layer, split)
    return kept + layer.attention_internal_bytes * split.mbs / (split.tp * split.cp)


def layer_tensor_shapes(layer: Layer, split: Split) -> tuple[int, ...]:
    """Sizes in bytes of the distinct tensors a layer's forward produces per micro-batch on one
    GPU, besides its hidden states: each GEMM's output (``rows x out_features``, split by TP
    for a column-parallel Linear, by SP for a row-parallel one, which TP leaves a whole
    partial sum otherwise) and, for explicit attention, the score tensors (``heads x s x s``:
    the scores and the softmax in 16 bits, the dropout mask in 1 byte and its output, as
    :func:`_score_bytes` counts them; the eager softmax's fp32 copies where the fused kernel
    does not run). For the step replay (costmodels/step_allocations.py)."""
    shapes = []
    for gemm in layer.gemms:
        divisor = (split.tp if gemm.split is TpSplit.COLUMN
                   or (gemm.split is TpSplit.ROW and split.sp) else 1)
        shapes += [WEIGHT_BYTES * gemm.rows * gemm.out_features * split.mbs
                   / (divisor * split.cp)] * gemm.count
    if not split.flash:
        for att in layer.attention:
            elements = att.num_heads * att.seq_len * att.seq_len * split.mbs / (
                split.tp * split.cp * split.cp)
            per_element = (2, 2, 1, 2) if att.dropout > 0 else (2, 2)
            if not split.softmax_fused(att):
                per_element = (2, *EAGER_WORKING_SHAPES, *per_element[2:])
            shapes += [b * elements for b in per_element]
    return tuple(int(size) for size in shapes)


def op_sac_block_bytes(layer: Layer, split: Split) -> float:
    """A block under torchtitan's op-level SAC keeps its input (the checkpoint's argument) and
    the outputs its policy saves. A row-parallel Linear's output is a whole partial sum on
    each TP rank, and with TP its reduce-scatter output (1/tp, a saved comm op) too."""
    replicated_div = split.tp if split.sp else 1
    partial_factor = 1 + 1 / split.tp if split.tp > 1 else 1
    saved = layer.op_sac_bytes.sharded / split.tp + layer.op_sac_bytes.partial * partial_factor
    return (layer.input_bytes / replicated_div + saved) * split.mbs / split.cp


def loss_peak_bytes(logits_bytes: float, split: Split, *, bytes_per_logit: int,
                    logit_element_bytes: int = WEIGHT_BYTES) -> float:
    """Bytes the cross-entropy over one micro-batch's logits holds at its peak on one GPU,
    besides the activations kept for the blocks' backward. ``logits_bytes``: the head's
    output per sample; the vocabulary is split over TP (vocab-parallel head and loss).

    ``bytes_per_logit`` per runtime: Megatron's fused vocab-parallel cross-entropy upcasts to
    fp32 (4, beside the 16-bit logits: 6) and turns that buffer into the softmax and then, in
    place, into the gradient (4, plus its 16-bit cast: 6). Plain ``cross_entropy(logits.float())``
    (torchtitan, HF) keeps the fp32 log-softmax (4) and in backward adds the dense fp32
    gradient of ``nll_loss`` (4) and of ``log_softmax`` (4): 12. The same call under torch's
    loss_parallel (torchtitan with TP: DTensor's handlers on the vocabulary shards) holds four
    fp32 tensors in its backward: 16 (:func:`cross_entropy_bytes_per_logit`).
    """
    elements = logits_bytes / logit_element_bytes
    return bytes_per_logit * elements * split.mbs / (split.tp * split.cp)


def cross_entropy_bytes_per_logit(runtime: RuntimeProfile, tp: int) -> int:
    """The runtime's cross-entropy peak per logit (:func:`loss_peak_bytes`): on vocabulary
    shards when TP splits the head and the runtime has a loss-parallel implementation."""
    if tp > 1 and runtime.loss_parallel_bytes_per_logit:
        return runtime.loss_parallel_bytes_per_logit
    return runtime.loss_bytes_per_logit


def held_fp32_logits_bytes(logits_bytes: float, split: Split, *,
                           logit_element_bytes: int = WEIGHT_BYTES) -> float:
    """The fp32 logits of one micro-batch on one GPU (vocab split over TP), as a pipeline
    engine holds them when they are the stage's output: Megatron-DeepSpeed's GPTModelPipe ends
    in ``float16_to_fp32`` and DeepSpeed's PipelineEngine keeps that output until the
    micro-batch's backward is done. Its fused cross-entropy works in place in that buffer."""
    return FP32_BYTES * logits_bytes / logit_element_bytes * split.mbs / (split.tp * split.cp)


LAST_STAGE_PIPE_BUFFERS = 2
"""Pipe buffers of DeepSpeed's last pipeline stage: ``TrainSchedule.num_pipe_buffers`` is
``max(2, min(stages - stage_id, micro_batches))``, 2 at ``stage_id = stages - 1``."""


def last_stage_output_slots(num_microbatches: int) -> int:
    """fp32 logits DeepSpeed's PipelineEngine keeps on its last stage between micro-batches.
    ``_exec_backward_pass`` returns right after the loss's backward on the last stage, without
    the ``pipe_buffers['outputs'][buffer_id] = None`` the other stages run, and the buffers
    persist across steps (``_reserve_pipe_buffers`` only extends them): each buffer the
    schedule uses keeps the last output written to it until a later forward replaces it."""
    return min(LAST_STAGE_PIPE_BUFFERS, num_microbatches)


def replaced_output_bytes(held_fp32_logits: float, logits_16bit: float) -> float:
    """The last stage's transient at the end of a forward under DeepSpeed's PipelineEngine,
    beyond the output slots it keeps: the new micro-batch's fp32 logits exist before
    ``pipe_buffers['outputs'][buffer_id] = outputs`` drops the older output in that buffer
    (``held_fp32_logits`` of it), while ``float16_to_fp32`` reads the ``logits_16bit``."""
    return held_fp32_logits + logits_16bit


def grad_copy_bytes_per_element(*, upcast_bytes: float, accumulates_into_grad: bool,
                                num_microbatches: int) -> float:
    """Bytes per element of the largest gradient's transient copy after a micro-batch's
    backward: a runtime's fp32 upcast (``upcast_bytes``), or where gradients accumulate in
    ``param.grad`` across micro-batches, the 16-bit gradient the backward op produces for a
    later micro-batch, alive beside ``.grad`` until autograd's AccumulateGrad adds it in place
    (the first micro-batch's is stolen into ``.grad``, no copy)."""
    accumulated = WEIGHT_BYTES if accumulates_into_grad and num_microbatches > 1 else 0
    return max(upcast_bytes, accumulated)


def upcast_grad_moment_bytes(copied_params: float, *, bytes_per_element: float,
                             others: float) -> float:
    """Activation-side bytes when a runtime adds 16-bit gradients into its fp32 accumulator
    after a micro-batch's backward, once that micro-batch's activations are freed and
    ``others`` bytes of other chunk-micro-batches are still in flight, with ``copied_params`` gradients' copies alive
    (``bytes_per_element`` each). DeepSpeed's BF16_Optimizer (``update_hp_grads``:
    ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))``) copies one parameter's gradient at
    a time to fp32: the largest parameter's, 4 bytes each. nanotron's
    ``FP32GradientAccumulator.backward`` runs ``loss.backward()`` whole and only then, parameter
    by parameter, ``fp32_grad.add_(half_param.grad)`` and ``half_param.grad = None``: the 16-bit
    gradient of every trained parameter the GPU holds, 2 bytes each (the runtime's
    ``grads_before_accumulation_bytes``)."""
    return others + bytes_per_element * copied_params


def ddp_bucket_copy_bytes(trained_params: float, *, bytes_per_param: float, data_parallel: int,
                          zero_stage: int, max_zero_stage: int) -> float:
    """The second copy of the gradients in torch DDP's buckets. ``DistributedDataParallel``
    with its default ``gradient_as_bucket_view=False`` allocates, when it wraps the model, flat
    buckets holding every trained parameter's gradient in the parameter's dtype
    (``bytes_per_param``), beside each ``param.grad``, and copies each gradient in when it is
    ready (torch docs: the view option saves "the total gradients size"). Only where DDP wraps
    the model: more than one data-parallel rank (``data_parallel``, dp x cp; nanotron's
    ``make_ddp``, torchtitan's replicate) at a ZeRO stage the runtime still runs under DDP
    (``max_zero_stage``: 0 for plain DDP, 1 for nanotron's ZeRO-1 optimizer over a DDP model)."""
    if not bytes_per_param or data_parallel <= 1 or zero_stage > max_zero_stage:
        return 0.0
    return bytes_per_param * trained_params


def backward_working_bytes(layer: Layer, split: Split, *, gathered_inputs: bool = False) -> float:
    """Transient bytes while one layer runs its backward: the gradients it produces are about
    as large as what it saved, and a fully recomputed layer first rebuilds all of that."""
    return layer_activation_bytes(layer, split, Recompute.NONE, gathered_inputs=gathered_inputs)


def zero3_buffer_bytes(largest_gathered: float, rank_params: float, *, bytes_per_param: float,
                       pipeline_resident: bool) -> float:
    """Unsharded copies ZeRO-3 holds besides the shards, for a GPU holding ``rank_params``
    parameters whose largest gather unit has ``largest_gathered``.

    Per unit (``bytes_per_param`` of the largest): DeepSpeed's own estimator counts a module's
    16-bit weights and gradient (4); FSDP2 in backward holds the running and the prefetched
    block's bf16 parameters (2 + 2), the block's bf16 gradient (2) and its fp32 copy for the
    reduce-scatter (torchtitan's ``mixed_precision_reduce = float32``: 4), 10 in all.
    ``pipeline_resident``: torchtitan with PP does not reshard after forward (its
    ``fsdp_reshard_after_forward = "default"``) and the pipeline schedule turns gradient sync
    off until the last micro-batch's backward (``stage.py``: ``set_requires_gradient_sync``),
    so the stage's bf16 parameters stay unsharded and FSDP2 accumulates unsharded gradients
    in the fp32 reduce dtype: 2 + 4 bytes per parameter of the stage."""
    if pipeline_resident:
        return (WEIGHT_BYTES + FP32_BYTES) * rank_params
    return bytes_per_param * largest_gathered


def reduce_queue_bytes(unit_params: float, units: int, *, queue_params: float,
                       grad_bytes: float, freed_per_unit: float) -> float:
    """The most that the unsharded gradient buckets of a ZeRO-2 that reduce-scatters every
    micro-batch (Megatron-FSDP's ``optim_grads``, profiles ``zero2_reduce_queue_params``) add
    to a chunk's backward beyond the saved activations that backward has freed.

    The backward fills one bucket per FSDP unit (``units`` of ``unit_params`` parameters,
    ``grad_bytes`` each), and each full bucket is issued as GradReducePipeline does
    (``reduce_gradients``): first ``wait_for_previous_grad_reduce`` frees the oldest queued
    buckets while the queue holds more than ``queue_params`` elements, then the bucket joins
    the queue. While unit k fills, the queue and unit k's bucket are held and the k units
    before it have freed ``freed_per_unit`` bytes each of the micro-batch's activations; the
    queue drains when the chunk's backward ends (``finish_grad_sync``)."""
    queued, peak = 0, 0.0
    for k in range(units):
        peak = max(peak, grad_bytes * (queued + 1) * unit_params - k * freed_per_unit)
        while queued * unit_params > queue_params:
            queued -= 1
        queued += 1
    return peak


CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024
CUBLAS_WORKSPACE_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
"""torch's cuBLAS workspace per handle and stream (aten/src/ATen/cuda/CublasHandlePool.cpp
``parseChosenWorkspaceSize``: ``:4096:8`` = 32 MiB on sm_90, ``:4096:2:16:8`` = 8 MiB + 128 KiB
elsewhere, unless CUBLAS_WORKSPACE_CONFIG says otherwise); cuBLASLt shares it (the unified
workspace, on unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0)."""

CUBLAS_HANDLES = 2
"""cuBLAS handles that run a training step's GEMMs on one GPU: the handle pool is per thread
(``getCurrentCUDABlasHandle``: a thread-local PoolWindow) and the workspace per handle and
stream (``setWorkspaceForHandle``), and autograd runs the backward on its own device thread,
the forward on the main one."""


def cublas_workspace_bytes(compute_capability: float | None) -> float:
    """torch's default cuBLAS workspaces on a GPU of ``compute_capability`` (unknown: priced
    as a Hopper's, the larger)."""
    per_handle = (CUBLAS_WORKSPACE_DEFAULT if compute_capability is not None
                  and compute_capability != 9.0 else CUBLAS_WORKSPACE_SM90)
    return CUBLAS_HANDLES * per_handle


NVLS_CHANNELS_SM90 = 16
NVLS_CHANNELS_SM100 = 32
"""NVLink SHARP channels of a communicator (NCCL 2.27 src/transport/nvls.cc:
``NVLS_NCHANNELS_SM90``, ``NVLS_NCHANNELS_SM100``)."""

NVLS_CHUNK_BYTES = 128 * 2**10
"""``NCCL_NVLS_CHUNKSIZE`` default, the NVLS step slot since NCCL 2.21. Older releases priced
more per channel and head: 2.18-2.20 the 4 MiB ``NCCL_BUFFSIZE`` plus a 2 MiB alignment
(``NVLS_MEM_ALIGN_SIZE``), six times as much; 2.21 1 MiB plus that 2 MiB; 2.23 on 1 MiB, set up
when a collective first picks NVLS (``ncclNvlsBufferSetup``). Priced as NCCL 2.27 sets it up."""

NCCL_STEPS = 8
"""Slots of a connection's buffer (NCCL src/include/device.h ``NCCL_STEPS``)."""

NVLS_MIN_LOCAL_GPUS = 3
"""``ncclNvlsInit`` leaves NVLS off for a communicator with two GPUs or fewer on a node."""

NVLS_MIN_COMPUTE_CAPABILITY = 9.0
"""NCCL's NVLS graph search skips GPUs below sm_90 and nodes without NVSwitch
(src/graph/search.cc: ``system->nodes[NVS].count == 0 || ccMin < 90``)."""


def nvls_buffer_bytes(members_per_node: int, *, compute_capability: float | None,
                      nvswitch: bool) -> float:
    """Device memory, outside PyTorch's caching allocator, that one communicator's NVLink SHARP
    buffers take on each GPU: ``ncclNvlsBufferSetup`` maps ``nChannels * 2 * buffSize * nHeads``
    bytes (reduce and broadcast halves per channel and head; ``buffSize = NVLS_CHUNKSIZE *
    NCCL_STEPS``), one head per GPU of the communicator on the node (the intra-node NVLS search
    "must have ngpus heads"). Only on NVSwitch nodes of Hopper or later GPUs, and for groups of
    three or more GPUs on a node."""
    if (not nvswitch or compute_capability is None
            or compute_capability < NVLS_MIN_COMPUTE_CAPABILITY
            or members_per_node < NVLS_MIN_LOCAL_GPUS):
        return 0.0
    channels = NVLS_CHANNELS_SM100 if compute_capability >= 10.0 else NVLS_CHANNELS_SM90
    return channels * 2 * NVLS_CHUNK_BYTES * NCCL_STEPS * members_per_node


def grad_norm_copy_bytes(largest_params: float, partition_params: float, *,
                         bytes_per_element: float) -> float:
    """The transient of the gradient norm at the optimizer step: DeepSpeed's ZeRO-1/2
    (``stage_1_and_2.get_grad_norm_direct``) converts each gradient of its partition to fp64
    (``zero.utils.get_norm_dtype``: ``torch.double``, 8 bytes per element) one tensor at a time,
    so the largest gradient piece a rank owns, at most its partition, is copied whole."""
    return bytes_per_element * min(largest_params, partition_params)


def flat_grad_copy_excess_bytes(trained_params: float, *, grad_bytes: float, dp: int) -> float:
    """What a ZeRO-1 optimizer's step adds over the resident states when it flattens its
    partition's 16-bit gradients into a new buffer before casting them to fp32 (DeepSpeed's
    ``stage_1_and_2.step``: ``flat_grad_partition = self.flatten(self.averaged_gradients[i])``,
    then ``.to(fp32)``, the flat copy deleted after). Just before, it frees the gradients of the
    parameters outside its partition (``free_grad_in_param_list(params_not_in_partition)``):
    the copy (``grad_bytes / dp`` per parameter) outweighs what was freed (``grad_bytes (dp - 1)
    / dp``) only for dp = 1, where it is a second whole copy of the gradients."""
    return grad_bytes * trained_params * max(0, 2 - dp) / dp


def reduction_copy_bytes(trained_params: float, *, bytes_per_param: float) -> float:
    """The flat copy DeepSpeed's engine makes as it all-reduces the gradients outside a ZeRO
    optimizer (``buffered_allreduce_fallback`` -> ``allreduce_no_retain`` ->
    ``allreduce_bucket``): ``flatten(bucket)``, then ``tensor.to(communication_data_type)``
    where the gradients' dtype differs. Under BF16_Optimizer the gradients are its fp32 flat
    buffer of the whole group (``get_grads_for_reduction``), one tensor larger than the
    500M-element bucket, so the flatten is a view and the cast to the bf16 communication dtype
    (``communication_data_type`` defaults to bf16 when bf16 is on) copies every trained
    parameter's gradient: ``bytes_per_param`` 2."""
    return bytes_per_param * trained_params


def in_flight_chunks(rank: int, *, pp: int, vpp: int, num_microbatches: int) -> int:
    """Chunk-micro-batches a pipeline rank holds as its first backward starts, the most it
    holds: its warm-up forwards plus one (pipeline.warmup_forwards; 1F1B: ``pp - rank``,
    Narayanan et al. 2021), at most all ``m vpp`` (pipeline.in_flight_moments has which
    chunks they are)."""
    return min(warmup_forwards(rank, pp=pp, vpp=vpp, num_microbatches=num_microbatches) + 1,
               num_microbatches * vpp)
