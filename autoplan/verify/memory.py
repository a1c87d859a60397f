"""Memory of a verification run: measured per rank, and predicted by autoplan's memory model.

Measured: the peak of live CPU tensor bytes of a rank over its training steps, from the
PyTorch profiler's allocation records (every allocation and free of the CPU allocator, in time
order) on top of the bytes its model already holds when the steps start (its parameter shards
and buffers). Python objects, gloo buffers and the allocator's own overhead are not counted.

Predicted: :mod:`autoplan.costmodels` evaluated on the same model traced at its real
dimensions in fp32 (activations in fp32 bytes), with an fp32 Adam runtime: 4-byte weights and
gradients, two 4-byte moments, no master copy, no CUDA context and no fragmentation allowance;
attention as the explicit kernel (the verification runs attention on the math kernel). The
memory model counts weights at 2 bytes (bf16), so its weight terms are doubled here. To that,
the prediction adds what this runtime holds and Megatron does not, each from its own formula:
the receive buffers of ``torch.distributed.pipelining`` and gloo's staging copies for FSDP's
collectives. Nothing in the prediction is taken from the measurement.
"""

from __future__ import annotations

import torch

from autoplan.costmodels.allocator import replay
from autoplan.costmodels.profiles import RuntimeProfile
from autoplan.graph.layer_graph import LayerKind

FP32_ADAM = RuntimeProfile(
    name="verify-fp32", grad_bytes=4, fp32_grad_bytes=0, master_bytes=0, moment_bytes=8,
    dp_overlap=0.0, zero3_overlap=0.0, zero3_collective_efficiency=1.0, tp_bwd_overlap=False,
    pp_scatter_gather=False, cuda_context_bytes=0.0, fragmentation=0.0, cublas_workspace_bytes=0.0,
    source="fp32 training with Adam on CPU (autoplan verify)")
FP32_WEIGHT_FACTOR = 2
"""fp32 weight bytes over the memory model's bf16 WEIGHT_BYTES."""
FP32_BYTES = 4
GLOO_STAGING_COPIES = 2
"""[Empirical] Layer-sized temporaries gloo adds to FSDP's collectives on CPU: an all-gather
lands in a temporary of its output before FSDP copies it out, and a reduce-scatter runs as an
all-reduce on a clone of its input (the profiler records them under ``c10d::_allgather_base_``
and ``c10d::_reduce_scatter_base_``, torch 2.13); NCCL does both in place."""


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t._local_tensor if isinstance(t, DTensor) else t


def held_bytes(modules) -> int:
    """Bytes of the distinct storages behind the real parameters and buffers of ``modules``."""
    seen, total = set(), 0
    for module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            t = _local(t)
            if t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def allocation_records(profiler) -> list[tuple[int, int, int]]:
    """(time ns, bytes, address) of every allocation (bytes > 0) and free (bytes < 0)."""
    from torch._C._profiler import _EventType
    records, stack = [], list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            records.append((node.start_time_ns, fields.alloc_size, fields.ptr))
    return records


def peak_of_records(records: list[tuple[int, int, int]]) -> int:
    """Highest sum of live blocks, replaying allocator records in time order.

    The records come from several threads (gloo's and autograd's) whose clocks interleave: a
    block freed on one thread and handed out again on another can show its new allocation a
    moment before its free. A block is therefore keyed by its address: a new allocation at a
    live address retires the old block, so no block is counted twice, and the late free of a
    retired block (its size differs) is dropped. Frees of blocks allocated before profiling
    began are ignored: what the model held then is counted by :func:`held_bytes`.
    """
    live: dict[int, int] = {}
    running = peak = 0
    for _, size, ptr in sorted(records):
        if size > 0:
            running += size - live.pop(ptr, 0)
            live[ptr] = size
            peak = max(peak, running)
        elif live.get(ptr) == -size:  # else the free of a block already retired, or older
            running -= live.pop(ptr)
    return peak


class PeakMemory:
    """Context manager measuring a rank's peak live tensor bytes (see the module docstring),
    and what PyTorch's CUDA caching allocator would reserve for the same allocations
    (``reserved_bytes``: the records replayed through its rules, costmodels.allocator, on top
    of the bytes held when the steps start)."""

    def __init__(self, rank_model) -> None:
        self.rank_model = rank_model
        self.peak_bytes = 0
        self.reserved_bytes = 0
        self._profiler = None
        self._held = 0

    def __enter__(self) -> "PeakMemory":
        from torch.profiler import ProfilerActivity, profile
        self._held = held_bytes(self.rank_model.stages)
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._profiler.__exit__(*exc)
        if exc[0] is None:
            records = allocation_records(self._profiler)
            self.peak_bytes = self._held + peak_of_records(records)
            self.reserved_bytes = self._held + replay(records).peak_reserved
        return False


def pipeline_buffer_bytes(problem, plan, rank: int) -> float:
    """Buffers ``torch.distributed.pipelining`` holds on a pipeline rank beyond what Megatron
    does (Megatron receives into the activation it keeps anyway and frees what it sent), so the
    memory model has no such term:

    * receive buffers: one per micro-batch for every stage input and output gradient,
      allocated at the first step and kept (``PipelineStage``'s recv infrastructure);
    * tensors being sent, the mirror images of those (stage outputs, input gradients), kept by
      their send until it is waited: the schedule waits for each send before the next in 1F1B,
      for all of them at the end of the step in interleaved 1F1B
      (``_PipelineScheduleRuntime``: "there isn't an obvious time when to wait for them").

    A stage's input is what the layer before it outputs (``boundary_bytes``); under sequence
    parallelism a tensor passed between two blocks is a sequence shard.
    """
    layers, layout = problem.graph.layers, plan.layout
    chain_blocks = {i for i, layer in enumerate(layers) if layer.kind is LayerKind.BLOCK}

    def passed(boundary: int) -> float:  # bytes per sample sent from boundary-1 to boundary
        sharded = (plan.sequence_parallel and boundary - 1 in chain_blocks
                   and boundary in chain_blocks)
        return layers[boundary - 1].boundary_bytes / (plan.tp if sharded else 1)

    per_sample = 0.0
    for stage in range(rank, len(layout), plan.pp):
        first, num = layout[stage]
        if stage > 0:
            per_sample += passed(first)
        if stage < len(layout) - 1:
            per_sample += passed(first + num)
    sends_held = plan.num_microbatches if plan.vpp > 1 else 1
    return per_sample * plan.micro_batch_size * (plan.num_microbatches + sends_held)


def gloo_staging_bytes(plan, largest_layer_params: float) -> float:
    """gloo's temporaries for FSDP's per-layer collectives (ZeRO 1-3 with dp > 1), at most one
    of each in flight for the largest layer (see :data:`GLOO_STAGING_COPIES`)."""
    if plan.dp == 1 or plan.zero_stage == 0:
        return 0.0
    return GLOO_STAGING_COPIES * FP32_BYTES * largest_layer_params


def predicted_rank_bytes(problem, plan) -> list[float]:
    """Bytes predicted for each pipeline rank: the memory model's (fp32 weights, see above)
    plus what this runtime adds to it: pipeline receive buffers and gloo's staging copies."""
    from autoplan.costmodels.placement import plan_links
    from autoplan.costmodels.ranks import rank_cost
    links = plan_links(problem, plan)
    out = []
    for rank in range(plan.pp):
        cost = rank_cost(problem, plan, rank, links)
        states = cost.states
        out.append(FP32_WEIGHT_FACTOR * states.weights + states.gradients + states.optimizer
                   + cost.activations + FP32_WEIGHT_FACTOR * cost.other
                   + (pipeline_buffer_bytes(problem, plan, rank) if plan.pp > 1 else 0.0)
                   + gloo_staging_bytes(plan, cost.largest))
    return out
