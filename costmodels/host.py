"""The host side of a training step: the CPU time eager PyTorch spends issuing the kernels of a
transformer block (Python, the dispatcher, autograd's bookkeeping, ``cudaLaunchKernel``), and
how much of it the GPU waits for.

Normally the host runs ahead: kernels queue on the stream while the CPU issues the next ones,
so a block costs the longer of its GPU time and its host time. A step turns host-bound where
the kernels are shorter than the time to issue them (large TP, small micro-batches, small
hidden sizes). With ``CUDA_LAUNCH_BLOCKING=1`` every launch returns only once its kernel has
finished, so nothing overlaps: the host time adds to the GPU time, and so does each kernel's
completion round trip. torch.compile shrinks the count of kernels issued (the runtime's
``compiled_block_forward_kernels`` against ``block_forward_kernels``); CUDA graphs, which would
replace the per-kernel host time by one launch per graph, are not priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.costmodels.compute import Split
from autoplan.costmodels.fused_softmax import EAGER_EXTRA_KERNELS
from autoplan.costmodels.profiles import RuntimeProfile

from autoplan.graph.layer_graph import Layer, LayerKind
from autoplan.plan import Recompute

HOST_SECONDS_PER_KERNEL = 1.2e-5
"""CPU seconds eager PyTorch spends issuing one kernel from Python: the Python call, the
dispatcher (autocast, autograd, the CUDA kernel's wrapper) and ``cudaLaunchKernel``.
pytorch/pytorch#161104 measures an eager ``x + y`` of two CUDA tensors at 1.1-1.3e-5 s a call;
benchmarks/host_overhead.py measures the dispatcher part on CPU tensors of this machine (no
launch) for comparison. Kernels the autograd engine issues in backward go through the same
dispatcher from C++; they are priced alike."""

COMPLETION_SECONDS_PER_KERNEL = 5.8e-6
"""Seconds a launch that waits for its kernel adds over one that overlaps the previous kernel:
NVIDIA's "Getting Started with CUDA Graphs" (A. Gray, 2019) runs 2.9 us kernels at 9.6 us each
with a stream synchronization after every launch, 3.8 us each without: 9.6 - 3.8 = 5.8 us.
``CUDA_LAUNCH_BLOCKING=1`` makes every launch such a synchronized one."""


@dataclass(frozen=True, slots=True)
class BlockKernels:
    """Kernels a runtime issues for one transformer block and one micro-batch."""

    forward: int
    backward: int

    def per_micro_batch(self, *, recomputed: bool) -> int:
        """Forward, backward and, under full recompute, the forward again."""
        return self.forward * (2 if recomputed else 1) + self.backward


def block_kernels(forward: int, backward: int, *, tp_collectives: int, tp: int,
                  sequence_parallel: bool) -> BlockKernels:
    """The kernels of a block whose runtime issues ``forward`` / ``backward`` compute kernels,
    plus its TP collectives: ``tp_collectives`` all-reduces each way without SP, an all-gather
    and a reduce-scatter for each with SP (none at TP 1)."""
    if tp == 1:
        return BlockKernels(forward, backward)
    collectives = tp_collectives * (2 if sequence_parallel else 1)
    return BlockKernels(forward + collectives, backward + collectives)


def host_seconds(kernels: int) -> float:
    """CPU seconds to issue ``kernels`` kernels."""
    return kernels * HOST_SECONDS_PER_KERNEL


def host_delay_s(gpu_s: float, kernels: int, *, launch_blocking: bool) -> float:
    """Seconds a block's ``kernels`` add to its ``gpu_s`` seconds of GPU work per micro-batch.

    Asynchronous launches: the GPU waits only where issuing takes longer than running,
    ``max(gpu, host) - gpu``. ``CUDA_LAUNCH_BLOCKING=1``: the host issues each kernel only
    after the previous one finished, so the host time and every kernel's completion round
    trip add in full."""
    host = host_seconds(kernels)
    if launch_blocking:
        return host + kernels * COMPLETION_SECONDS_PER_KERNEL
    return max(0.0, host - gpu_s)


def runtime_block_kernels(runtime: RuntimeProfile) -> tuple[int, int]:
    """(forward, backward) compute kernels of one block as the runtime issues them: compiled
    where ``compile`` is on and the runtime states the compiled counts, else eager."""
    if runtime.compile and runtime.compiled_block_forward_kernels:
        return runtime.compiled_block_forward_kernels, runtime.compiled_block_backward_kernels
    return runtime.block_forward_kernels, runtime.block_backward_kernels


def layer_host_delay_s(runtime: RuntimeProfile, layer: Layer, split: Split, recompute: Recompute,
                       gpu_s: float) -> float:
    """Seconds the host side adds to ``layer``'s ``gpu_s`` seconds of GPU work (compute and
    exposed collectives) per micro-batch: the runtime's kernels of a transformer block, its
    forward rerun under full recompute, priced by :func:`host_delay_s`; explicit attention's
    eager softmax fallback issues its extra kernels (costmodels.fused_softmax). Other layers (the
    embedding, the head and loss) issue a handful of kernels beside long vocabulary GEMMs and
    are not priced."""
    forward, backward = runtime_block_kernels(runtime)
    if layer.kind is not LayerKind.BLOCK or not forward:
        return 0.0
    eager = EAGER_EXTRA_KERNELS * sum(not split.flash and not split.softmax_fused(att)
                                      for att in layer.attention)
    kernels = block_kernels(forward + eager, backward + eager, tp_collectives=layer.tp_allreduces,
                            tp=split.tp, sequence_parallel=split.sp)
    issued = kernels.per_micro_batch(recomputed=recompute is Recompute.FULL)
    return host_delay_s(gpu_s, issued, launch_blocking=runtime.launch_blocking)
