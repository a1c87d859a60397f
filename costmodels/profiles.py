"""Calibration data of the cost models: per-GPU achieved efficiencies and per-runtime behaviour.

The numbers live in profiles.yaml with their sources; a measured profile (``autoplan
calibrate``) can replace the compute part for one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache

from autoplan.packaged import read_yaml
from autoplan.units import parse_quantity


@dataclass(frozen=True, slots=True)
class ComputeProfile:
    """How close to peak a GPU runs each kind of kernel [Empirical]."""

    gemm_efficiency: float
    gemm_half_flops: float
    attention_efficiency: float
    bmm_efficiency: float
    memory_efficiency: float
    kernel_overhead_s: float
    fp8_gemm_share: float = 1.0
    """Under FP8, the share of the 16-bit GEMMs' plateau efficiency (``gemm_efficiency``)
    that FP8 GEMMs with fast accumulation reach at the GPU's FP8 peak (1: twice the 16-bit
    speed where the FP8 peak is twice the 16-bit one)."""
    fp8_split_accumulator_slowdown: float = 1.0
    """How much longer an FP8 GEMM runs with cuBLAS's split accumulator (partial sums promoted
    to fp32 as the k-loop runs; ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` = 0) than with fast
    accumulation. Transformer Engine runs its input- and weight-gradient GEMMs so
    (costmodels.fp8.linear_rate); 1 where the GPU has no such mode."""
    attention_kernels: tuple = ()
    """Published speed of fused attention kernels on this GPU: ``(kernel, pass, ((seq,
    TFLOP/s), ...))`` for the causal forward (``causal_fwd``) and the unmasked forward and
    backward (``fwd``, ``bwd``) at head dim 128, in the kernels' own FLOP convention (a causal
    call counts half the dense ``4 s^2 d`` FLOPs per head);
    empty: the scalar ``attention_efficiency`` at every length
    (costmodels.compute.attention_rate)."""
    source: str = ""


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    """What a training framework keeps in memory and how much communication it hides."""

    name: str
    grad_bytes: int
    fp32_grad_bytes: int
    master_bytes: int
    moment_bytes: int
    dp_overlap: float
    zero3_overlap: float
    zero3_collective_efficiency: float
    tp_bwd_overlap: bool
    pp_scatter_gather: bool
    cuda_context_bytes: float
    fragmentation: float
    attention_kernel: str = "flash2"
    """The fused attention kernel the runtime runs (a key of the GPU's ``attention_kernels``):
    flash-attn 2's kernels for every runtime costed, see profiles.yaml."""
    zero3_gather_unit: str = "layer"
    zero2_gathers_per_microbatch: bool = False
    """ZeRO-2 as FSDP1's SHARD_GRAD_OP runs it: every micro-batch all-gathers each unit's
    parameters for its forward (kept through the backward) and reduce-scatters its gradients,
    one collective per unit each, like ZeRO-3 less the backward re-gather (profiles.yaml)."""
    zero2_reduce_queue_params: float = 0.0
    """ZeRO-2 as Megatron-FSDP's ``optim_grads`` runs it (megatron-core 0.16
    ``megatron_fsdp.py``): every micro-batch's backward reduce-scatters each FSDP unit's
    gradients from an unsharded bucket (``no_sync``: "for grads shard mode there will actually
    always be gradient sync"), and a bucket is freed only once the reductions issued before it
    exceed this many elements (``suggested_RS_queue_capacity``, at least 1e9): the unsharded
    gradients of that many parameters plus two units live in the backward
    (memory.reduce_queue_bytes, costmodels.sync). 0: the runtime's ZeRO-2 is not this."""
    zero3_prefetch_bucket_params: float = 0.0
    zero3_max_live_params: float = 0.0
    reduce_bucket_params: float = 0.0
    """DeepSpeed ZeRO-3's stage3_prefetch_bucket_size, stage3_max_live_parameters and
    reduce_bucket_size (elements): what sets how many all-gathers and reduce-scatters a pass
    issues (costmodels.sync.zero3_calls); 0: one collective per gather unit and pass. The
    reduce bucket also cuts ZeRO 0-2's gradient reduction into collectives of that many
    elements (costmodels.sync.bucketed_reduction); 0: one collective."""
    selective_recompute: str = "attention"
    loss_bytes_per_logit: int = 12
    loss_parallel_bytes_per_logit: int = 0
    """Bytes per logit the cross-entropy holds at its peak when TP splits the vocabulary and the
    runtime computes the loss on the shards (torchtitan's ``loss_parallel``); 0: as
    ``loss_bytes_per_logit``."""
    sp_saves_gathered_input: bool = False
    zero3_gather_bytes: float = 4.0
    zero3_pp_resident: bool = False
    zero_bucket_bytes: float = 0.0
    reduce_bytes: float = 0.0
    """Bytes per gradient element the data-parallel reduction sends (0: ``grad_bytes``):
    4 where gradients are reduced in fp32 though computed in bf16 (FSDP's reduce_dtype)."""
    unshard_copy_bytes: float = 0.0
    """HBM bytes per gathered parameter that ZeRO-3's copy kernels move on the compute
    stream per micro-batch (costmodels.compute.unshard_copy_time); 0 where the collectives
    write the parameters in place."""
    optimizer_step_traffic_bytes: float = 0.0
    """HBM bytes per trained parameter that the optimizer step and its gradient clipping move
    where the runtime runs them as one kernel per tensor operation
    (costmodels.sync.per_op_bytes: Composer's DecoupledAdamW and FSDP1's clip_grad_norm_,
    sync.COMPOSER_STEP_OPS); 0: one fused pass over the states and the gradient
    (memory.optimizer_step_bytes plus ``grad_bytes``)."""
    grad_norm_bytes: float = 0.0
    """Bytes per element of the copy a ZeRO-1/2 optimizer makes of each gradient to take its
    norm at the step (memory.grad_norm_copy_bytes); 0: the norm is taken in place."""
    grad_upcast_bytes: float = 0.0
    """Bytes per element of the copy a runtime makes of each 16-bit gradient, one parameter at
    a time, to add it into an fp32 gradient accumulator after every micro-batch's backward
    (DeepSpeed's BF16_Optimizer: memory.upcast_grad_moment_bytes); 0: accumulated in place."""
    accumulates_into_grad: bool = False
    """Gradients accumulate in ``param.grad`` across micro-batches through autograd's
    AccumulateGrad (DeepSpeed's ZeRO-0/1 and BF16_Optimizer keep ``.grad``), so a later
    micro-batch's gradient of a parameter is a second 16-bit copy until added in
    (memory.grad_copy_bytes_per_element)."""
    grads_before_accumulation_bytes: float = 0.0
    """Bytes per trained parameter of the 16-bit gradients that all exist at once after each
    micro-batch's backward, where the runtime adds them into its fp32 buffer only once the
    whole backward is done (nanotron's FP32GradientAccumulator: memory.upcast_grad_moment_bytes
    over every parameter of the GPU); 0: folded in as the backward produces them (Megatron's
    gradient_accumulation_fusion and main_grad hooks)."""
    ddp_bucket_copy_bytes: float = 0.0
    ddp_max_zero_stage: int = 0
    """Bytes per trained parameter of the gradient copy torch DDP keeps in its buckets beside
    ``param.grad`` (gradient_as_bucket_view=False, torch's default), where the runtime wraps
    the model in DDP: dp x cp > 1 at ZeRO stages up to ``ddp_max_zero_stage``
    (memory.ddp_bucket_copy_bytes); 0: no DDP copy."""
    zero_grads_all_reduced: bool = False
    """ZeRO-1/2 reduce each gradient bucket with an all-reduce, every rank keeping its own
    partition of the result, instead of a reduce-scatter: twice the ring traffic of the
    reduction (DeepSpeed's average_tensor, ``use_multi_rank_bucket_allreduce`` true by default,
    and its BF16_Optimizer's buffered_allreduce_fallback: costmodels.sync)."""
    step_flattens_grads: bool = False
    """The ZeRO-1/2 optimizer flattens its partition's 16-bit gradients into a new buffer at the
    step (memory.flat_grad_copy_excess_bytes; DeepSpeed's, unless pre-flattened by ZeRO-2)."""
    reduction_copy_bytes: float = 0.0
    """Bytes per trained parameter of the copy the runtime's gradient all-reduce makes at ZeRO 0
    (memory.reduction_copy_bytes: DeepSpeed's BF16_Optimizer, 2, its fp32 gradients cast to
    the bf16 communication dtype); 0: none."""
    pp_holds_stage_outputs: bool = False
    """The pipeline engine keeps each in-flight micro-batch's stage output until that
    micro-batch's backward (DeepSpeed's PipelineEngine: ``pipe_buffers['outputs']``)."""
    pp_keeps_last_outputs: bool = False
    """torch.distributed.pipelining keeps every micro-batch's last-stage output for the schedule
    to return (stage.py ``output_chunks.append(output)``): the torch of late 2024 under
    torchtitan 9dec370 always; later ones not where the caller passes ``return_outputs=False``,
    as torchtitan 0.3's trainer does (so off by default; costmodels.ranks)."""
    pp_batched_p2p: bool = True
    """Each pipeline exchange is one batched isend/irecv pair (Megatron-LM); False: every send
    and receive is its own blocking call (DeepSpeed's PipelineEngine,
    pipeline.blocking_transfers)."""
    pp_partition_gathers: bool = False
    """With ``pp_scatter_gather``, each partitioned transfer is preceded by its meta tensor and
    the TP group all-gathers the pieces (DeepSpeed's PartitionedTensor,
    pipeline.partition_gathers); False: the 1/tp sends alone are priced."""
    grad_accumulation_bytes: float = 0.0
    """HBM bytes per trained parameter that each micro-batch spends folding its gradient into
    the accumulated one outside the weight-gradient GEMM (ranks.grad_accumulation_time);
    0 where the GEMM accumulates in place (Megatron's gradient_accumulation_fusion)."""
    bf16_optimizer_accumulation_bytes: float = 0.0
    """The same where bf16 training runs DeepSpeed's BF16_Optimizer (ZeRO stage 0 with the
    pipeline engine), which also keeps an fp32 copy of the accumulated gradients."""
    overlap_grad_reduce: bool = False
    """Gradients reduced bucket by bucket as the last micro-batch's backward produces them
    (Megatron's --overlap-grad-reduce), priced by that schedule (costmodels.sync) instead
    of the ``dp_overlap`` fraction."""
    overlap_param_gather: bool = False
    """With the distributed optimizer, the updated parameters all-gathered bucket by bucket
    under the next step's first forward (Megatron's --overlap-param-gather)."""
    grad_bucket_params: float = 4.0e7
    grad_bucket_params_per_rank: float = 1.0e6
    """Bucket of ``max(grad_bucket_params, grad_bucket_params_per_rank * dp)`` parameters
    (megatron-core's default bucket_size)."""
    ddp_bucket_bytes: float = 0.0
    ddp_first_bucket_bytes: float = 0.0
    """PyTorch DDP's gradient buckets where the runtime runs ZeRO 0 as DDP: each all-reduced
    as soon as the backward has filled it, the first (the last layers) smaller; 0: the
    runtime's ZeRO 0 does not bucket this way."""
    compile: bool = False
    """The runtime runs its blocks through torch.compile (torchtitan's ``compile`` flag,
    ``apply_compile``: each TransformerBlock, the loss and output layer eager); off by default
    as in torchtitan, on through ``runtime_settings={"compile": True}``."""
    compiled_elementwise_fraction: float = 1.0
    """Share of a block's eager element-wise HBM traffic (forward and backward) that Inductor's
    fused kernels still move where ``compile`` is on (benchmarks/compiled_traffic.py)."""
    block_forward_kernels: int = 0
    block_backward_kernels: int = 0
    """Compute kernels the runtime issues for one transformer block and micro-batch, forward and
    backward (TP collectives apart: costmodels.host.block_kernels); 0: the host side is not
    priced."""
    compiled_block_forward_kernels: int = 0
    compiled_block_backward_kernels: int = 0
    """The same where ``compile`` is on (Inductor's fused kernels, the library ones and
    AccumulateGrad's outside the graph); 0: as eager."""
    launch_blocking: bool = False
    """The run sets ``CUDA_LAUNCH_BLOCKING=1``: every launch waits for its kernel, so the
    host's time adds to the GPU's (costmodels.host.host_delay_s); on through
    ``runtime_settings={"launch_blocking": True}``."""
    transformer_impl: str | None = None
    """The block implementation whose fused element-wise kernels the runtime runs
    (costmodels.fused_kernels: Megatron-LM's ``--transformer-impl``, ``transformer_engine`` or
    ``local``); None: the traced eager kernels."""
    fused_softmax_check: str | None = None
    """How explicit attention's fused softmax kernel is chosen (costmodels.fused_softmax:
    ``key_length`` as megatron-core checks it, ``heads_per_gpu`` as Megatron-DeepSpeed did from
    2021-10 to 2022-03); None (the default of every runtime): priced fused, as before."""
    tp_comm_overlap: bool = False
    """Megatron-LM's ``--tp-comm-overlap``: Transformer Engine's userbuffers overlap a block's
    sequence-parallel collectives with its GEMMs (costmodels.tp_overlap); needs
    ``transformer_impl: transformer_engine``. Off in every runtime, as in Megatron-LM."""
    grad_reduce_in_bf16: bool = False
    """Megatron-LM's ``--grad-reduce-in-bf16`` (megatron-core's DDP ``grad_reduce_in_fp32``
    off, as NeMo's performance recipes run): under bf16 or FP8 the gradient buffer and its
    data-parallel reduction are bf16 (``param_and_grad_buffer.py``: ``grad_dtype = torch.float
    if grad_reduce_in_fp32 else param.dtype``), and the optimizer step copies the gradients of
    its shard to fp32 for the fp32 master weights (``distrib_optimizer.py``
    ``_copy_model_grads_to_main_grads``: ``shard_model_grad.float()``), kept until the next
    step's ``zero_grad``: :func:`with_gradient_dtype`. Off, as Megatron-LM's bf16 default
    (fp32 main grads)."""
    tp_comm_overlap_cfg: tuple = ()
    """Its per-op settings (``--tp-comm-overlap-cfg``; given as TE's mapping of op name to
    num_sm / set_sm_margin / num_splits, kept as tp_overlap.frozen_cfg has it); (): TE's
    defaults."""
    fp8_weight_cache: bool = False
    """Under FP8, Transformer Engine's Linears keep their FP8 weights (and transposes) cast on
    a step's first micro-batch for the others (the runtime passes ``is_first_microbatch``:
    Megatron-LM), 2 bytes per weight held all step (costmodels.fp8); False: cast at every
    micro-batch's forward and freed after its backward (Composer, FSDP2)."""
    cublas_workspace_bytes: float | None = None
    """cuBLAS workspaces per GPU, allocated through PyTorch's caching allocator; None: torch's
    default for the GPU (memory.cublas_workspace_bytes); 0 on CPU."""
    source: str = ""


def reduces_every_microbatch(runtime: RuntimeProfile, zero_stage: int) -> bool:
    """Whether ``zero_stage`` is a ZeRO-2 that reduce-scatters the gradients after every
    micro-batch's backward and keeps the parameters whole, through a queue of unsharded
    buckets (Megatron-FSDP's optim_grads: ``zero2_reduce_queue_params``)."""
    return zero_stage == 2 and runtime.zero2_reduce_queue_params > 0


def pipeline_resident(runtime: RuntimeProfile, zero_stage: int, pp: int) -> bool:
    """Whether ZeRO-3 keeps a pipeline stage's parameters gathered through the step and reduces
    its gradients once: FSDP2 under torch's pipelining as torchtitan runs it
    (``reshard_after_forward=False`` with PP, "to avoid per-microbatch all-gathers, which can be
    expensive and non-overlapped", torchtitan parallelize ``apply_fsdp``; the schedule turns
    gradient sync off and calls FSDP's post-backward itself after the last micro-batch's
    backward, torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``): the
    runtime's ``zero3_pp_resident``, for the memory (costmodels.ranks) and the step
    (costmodels.sync) alike."""
    return zero_stage == 3 and pp > 1 and runtime.zero3_pp_resident


ATTENTION_KERNELS = ("flash2", "cudnn", "flash3", "triton")
"""The fused attention kernels a runtime's ``attention_kernel`` may name (profiles.yaml;
``triton`` is priced from flash2's rates, costmodels.compute.RELATIVE_KERNELS)."""

FITTED = ("compute.gemm_efficiency", "compute.attention_efficiency", "compute.bmm_efficiency",
          "compute.memory_efficiency", "deepspeed.zero3_collective_efficiency",
          "deepspeed.zero3_overlap", "fsdp.zero3_overlap")
"""The [Empirical] constants a refit may change, all global: ``compute.<field>`` scales that
field of every GPU's profile by one factor (1 = as profiles.yaml states it), ``<runtime>.<field>``
sets one runtime's value. benchmarks/accuracy.py refits them leaving one source out."""

BF16_BYTES = 2
FP32_BYTES = 4
"""Bytes per element of a bf16 and an fp32 gradient (with_gradient_dtype)."""

SCALE_GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5)
OVERLAP_GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
EFFICIENCY_GRID = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)


def fit_grid(key: str) -> tuple[float, ...]:
    """The values a refit tries for a FITTED constant: scales for compute efficiencies,
    fractions of bus bandwidth or of overlap for a runtime's."""
    if key.startswith("compute."):
        return SCALE_GRID
    return EFFICIENCY_GRID if key.endswith("efficiency") else OVERLAP_GRID


@cache
def _profiles() -> dict:
    return read_yaml("autoplan.costmodels", "profiles.yaml")


def _build(cls, entry: dict, **extra):
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in entry.items() if k in names}, **extra)


def _kernel_table(kernels: dict) -> tuple:
    """profiles.yaml's ``attention_kernels`` mapping as the hashable tuple ComputeProfile holds."""
    return tuple((kernel, direction, tuple(sorted((int(s), float(t)) for s, t in rates.items())))
                 for kernel, passes in kernels.items() for direction, rates in passes.items())


def compute_profile(gpu_name: str) -> ComputeProfile:
    """The compute profile of a catalog GPU, or the generic default for others."""
    table = _profiles()["compute"]
    entry = dict(table.get(gpu_name, table["default"]))
    entry["attention_kernels"] = _kernel_table(entry.get("attention_kernels", {}))
    return _build(ComputeProfile, entry)


def with_gradient_dtype(runtime: RuntimeProfile) -> RuntimeProfile:
    """The runtime with ``grad_reduce_in_bf16`` applied: a bf16 gradient buffer (2 bytes per
    parameter, reduced in bf16) and the step's fp32 copy of the optimizer shard's gradients
    (4 bytes per parameter, sharded like the optimizer state: ``fp32_grad_bytes``). The copy
    is counted all step, which holds it at the optimizer step and overstates the backward by
    4/dp bytes per parameter. Where the gradients are already 16-bit (fp16 training) the flag
    is turned off, as Megatron-LM reads it only under bf16: on the result it means priced."""
    if not runtime.grad_reduce_in_bf16:
        return runtime
    if runtime.grad_bytes <= BF16_BYTES:
        return replace(runtime, grad_reduce_in_bf16=False)
    return replace(runtime, grad_bytes=BF16_BYTES, fp32_grad_bytes=FP32_BYTES)


def runtime_profile(name: str, precision: str = "bf16") -> RuntimeProfile:
    """A runtime's profile for a training precision (some keep fp16 gradients in fp16)."""
    entry = dict(_profiles()["runtimes"][name])
    entry["cuda_context_bytes"] = parse_quantity(entry["cuda_context_bytes"], "memory")
    if precision == "fp16" and "fp16_grad_bytes" in entry:
        entry["grad_bytes"] = entry["fp16_grad_bytes"]
    return _build(RuntimeProfile, entry, name=name)
