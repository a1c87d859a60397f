"""Memory of a verification run: measured per rank, and predicted by autoplan's memory model.

Measured: the peak of live CPU tensor bytes of a rank over its training steps, from the
PyTorch profiler's allocation records (every allocation and free of the CPU allocator, in time
order) on top of the bytes its model already holds when the steps start (its parameter shards
and buffers). Python objects, gloo buffers and the allocator's own overhead are not counted.

Predicted: :mod:`autoplan.costmodels` evaluated on the same model traced at its real
dimensions in fp32 (activations in fp32 bytes), with an fp32 Adam runtime: 4-byte weights and
gradients, two 4-byte moments, no master copy, no CUDA context and no fragmentation allowance;
attention as the explicit kernel (the verification runs attention on the math kernel). The
memory model counts weights at 2 bytes (bf16), so its weight terms are doubled here.
"""

from __future__ import annotations

import torch

from autoplan.costmodels.profiles import RuntimeProfile

FP32_ADAM = RuntimeProfile(
    name="verify-fp32", grad_bytes=4, fp32_grad_bytes=0, master_bytes=0, moment_bytes=8,
    dp_overlap=0.0, zero3_overlap=0.0, zero3_collective_efficiency=1.0, tp_bwd_overlap=False,
    pp_scatter_gather=False, cuda_context_bytes=0.0, fragmentation=0.0,
    source="fp32 training with Adam on CPU (autoplan verify)")
FP32_WEIGHT_FACTOR = 2
"""fp32 weight bytes over the memory model's bf16 WEIGHT_BYTES."""


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


def _peak_of(profiler) -> int:
    """Highest running sum of allocation records (frees are negative), in time order."""
    from torch._C._profiler import _EventType
    records, stack = [], list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            records.append((node.start_time_ns, node.extra_fields.alloc_size))
    running = peak = 0
    for _, size in sorted(records):
        running += size
        peak = max(peak, running)
    return peak


class PeakMemory:
    """Context manager measuring a rank's peak live tensor bytes (see the module docstring)."""

    def __init__(self, rank_model) -> None:
        self.rank_model = rank_model
        self.peak_bytes = 0
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
            self.peak_bytes = self._held + _peak_of(self._profiler)
        return False


def predicted_rank_bytes(problem, plan) -> list[float]:
    """Bytes the memory model predicts for each pipeline rank (fp32 weights, see above)."""
    from autoplan.costmodels.step import _plan_links, _rank_cost
    links = _plan_links(problem, plan)
    out = []
    for rank in range(plan.pp):
        cost = _rank_cost(problem, plan, rank, links)
        states = cost.states
        out.append(FP32_WEIGHT_FACTOR * states.weights + states.gradients + states.optimizer
                   + cost.activations + FP32_WEIGHT_FACTOR * cost.other)
    return out
