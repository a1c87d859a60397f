"""The host side of a step, measured with real torch on this machine's CPU.

1. Kernels per block: torchtitan's Llama block (benchmarks/compiled_traffic.py's copy of
   torchtitan 9dec370) run eager, forward and backward under TorchDispatchMode; every aten op
   dispatched that is not a view or an allocation launches one kernel on a GPU. The backward is
   counted at its second micro-batch, where autograd's AccumulateGrad adds into the existing
   ``.grad`` (one kernel per parameter) instead of taking the first gradient as it is. This is
   what ``fsdp``'s ``block_forward_kernels`` / ``block_backward_kernels`` state
   (costmodels/profiles.yaml). The torch.compile'd block (Inductor, as torchtitan's
   ``apply_compile``): the kernels of its forward and backward graphs (scheduler nodes that are
   not views), for ``compiled_block_forward_kernels`` / ``compiled_block_backward_kernels``
   (AccumulateGrad runs outside the graph). Measured with torch 2.13: eager 36 and 75,
   compiled 29 and 38.
2. Seconds per op of the dispatcher on CPU tensors of one element (Python call, dispatcher,
   a trivial CPU kernel; no CUDA launch), eager with autograd recording, for comparison with
   costmodels.host.HOST_SECONDS_PER_KERNEL (which adds cudaLaunchKernel on a GPU): 16-22 us
   on this shared 2-core machine under load. Takes a few minutes (Inductor compiles C++).

    .venv/bin/python benchmarks/host_overhead.py
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compiled_traffic import MOVE_NOTHING, _inputs, _left_to_aten, compiled_graph_sums  # noqa: E402

from autoplan.costmodels.host import HOST_SECONDS_PER_KERNEL  # noqa: E402


class KernelCount(TorchDispatchMode):
    """Aten ops dispatched that launch a kernel (not views or allocations), by name."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[1]
        if name not in MOVE_NOTHING:
            self.by_op[name] += 1
        return func(*args, **(kwargs or {}))


def block_kernels() -> tuple[collections.Counter, collections.Counter]:
    """(forward, backward) kernels of one eager block for one later micro-batch."""
    block, x, f = _inputs()
    block(x, f).sum().backward()  # the first micro-batch leaves .grad to accumulate into
    with KernelCount() as fwd:
        y = block(x, f)
    with KernelCount() as bwd:
        y.backward(torch.ones_like(y))
    return fwd.by_op, bwd.by_op


def launches_kernel(node) -> int:
    """1 for a scheduler node of a compiled graph that runs a kernel: one Inductor generates
    (fused nodes count once) or an extern one (matmul, attention, an op left to ATen) other
    than a view; 0 for the nodes that move nothing (NopKernelSchedulerNode, views)."""
    from torch._inductor.scheduler import NopKernelSchedulerNode

    if isinstance(node, NopKernelSchedulerNode):
        return 0
    return int(_left_to_aten(node) not in MOVE_NOTHING)


def compiled_block_kernels() -> list[int]:
    """Kernels of the torch.compile'd block per compiled graph (forward, then backward)."""
    return compiled_graph_sums(launches_kernel)


def seconds_per_op(calls: int = 20000) -> float:
    """Best of five runs of ``calls`` eager adds of one-element CPU tensors that record
    autograd, per call."""
    a = torch.ones(1, requires_grad=True)
    b = torch.ones(1)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            a + b
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    fwd, bwd = block_kernels()
    print(f"torchtitan Llama block, eager: {sum(fwd.values())} forward kernels, "
          f"{sum(bwd.values())} backward kernels (second micro-batch)")
    print("  forward:", dict(sorted(fwd.items())))
    print("  backward:", dict(sorted(bwd.items())))
    compiled = compiled_block_kernels()
    print(f"torch.compile'd block: kernels per graph (forward, backward) {compiled}")
    measured = seconds_per_op()
    print(f"eager op on one-element CPU tensors (dispatcher, no launch): {measured * 1e6:.2f} us; "
          f"HOST_SECONDS_PER_KERNEL (with cudaLaunchKernel): {HOST_SECONDS_PER_KERNEL * 1e6:.1f} us")


if __name__ == "__main__":
    main()
