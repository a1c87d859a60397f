"""Calibration data of the cost models: per-GPU achieved efficiencies and per-runtime behaviour.

The numbers live in profiles.yaml with their sources; a measured profile (``autoplan
calibrate``) can replace the compute part for one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
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
    zero3_gather_unit: str = "layer"
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
    grad_norm_bytes: float = 0.0
    """Bytes per element of the copy a ZeRO-1/2 optimizer makes of each gradient to take its
    norm at the step (memory.grad_norm_copy_bytes); 0: the norm is taken in place."""
    pp_holds_stage_outputs: bool = False
    """The pipeline engine keeps each in-flight micro-batch's stage output until that
    micro-batch's backward (DeepSpeed's PipelineEngine: ``pipe_buffers['outputs']``)."""
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
    cublas_workspace_bytes: float = 32 * 2**20
    """cuBLAS workspace PyTorch allocates per handle and stream through its caching allocator:
    32 MiB, the size the cuBLAS docs recommend for Hopper (``cublasSetWorkspace``; 4 MiB
    before); none on CPU."""
    source: str = ""


FITTED = ("compute.gemm_efficiency", "compute.attention_efficiency", "compute.bmm_efficiency",
          "compute.memory_efficiency", "deepspeed.zero3_collective_efficiency",
          "deepspeed.zero3_overlap", "fsdp.zero3_overlap", "fsdp.dp_overlap")
"""The [Empirical] constants a refit may change, all global: ``compute.<field>`` scales that
field of every GPU's profile by one factor (1 = as profiles.yaml states it), ``<runtime>.<field>``
sets one runtime's value. benchmarks/accuracy.py refits them leaving one source out."""

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


def compute_profile(gpu_name: str) -> ComputeProfile:
    """The compute profile of a catalog GPU, or the generic default for others."""
    table = _profiles()["compute"]
    return _build(ComputeProfile, table.get(gpu_name, table["default"]))


def runtime_profile(name: str, precision: str = "bf16") -> RuntimeProfile:
    """A runtime's profile for a training precision (some keep fp16 gradients in fp16)."""
    entry = dict(_profiles()["runtimes"][name])
    entry["cuda_context_bytes"] = parse_quantity(entry["cuda_context_bytes"], "memory")
    if precision == "fp16" and "fp16_grad_bytes" in entry:
        entry["grad_bytes"] = entry["fp16_grad_bytes"]
    return _build(RuntimeProfile, entry, name=name)
