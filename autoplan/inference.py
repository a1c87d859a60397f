"""Inference placement for Hugging Face ``device_map``: which GPU holds which layer, and the
predicted time per generated token.

Layers are placed in order, each GPU filled up to its memory limit before the next is used
(the fewest GPUs; HF runs the layers of a device map one after another anyway). A layer needs
its weights and its KV cache (2 tensors x batch x context x KV heads x head dim, 16-bit).

Decoding one token in eager PyTorch runs each layer as a chain of small kernels, each launched
by the host (Python, the ATen dispatcher, cudaLaunchKernel) before it can run. A kernel takes
the longer of its launch and its own work, which at small batch is streaming its operands
through HBM at the GPU's achieved bandwidth: each Linear's weights (a MoE layer reads only the
experts its tokens hit), the attention call's KV cache, and the norms, activations, rotary and
residual kernels, too small to outlast their launch. So decode is bandwidth-bound only where
the weight reads are long against a launch: the big GEMVs; the many small kernels cost their
launches whatever the GPU, which is why a slower-memory GPU is less slower per token than its
bandwidth says. A hop between GPUs is added where the map changes device.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autoplan.cluster.spec import Cluster
from autoplan.costmodels import comm
from autoplan.costmodels.profiles import compute_profile
from autoplan.cluster.topology import group_links
from autoplan.errors import InfeasibleError
from autoplan.graph.layer_graph import Layer, LayerGraph, LayerKind
from autoplan.units import GIB

WEIGHT_BYTES = 2
"""16-bit weights and KV cache."""

INFERENCE_CONTEXT_BYTES = 1.0 * GIB
"""CUDA context and workspaces of an inference process, per GPU (stated allowance)."""

KERNEL_LAUNCH_S = 2.0e-5
"""[Empirical] host time of one kernel-launching op in eager PyTorch: Python, the dispatcher,
the backend and cudaLaunchKernel, 5-25 us per op (PyTorch's dispatch stack; "overhead bound"
in He, "Making Deep Learning Go Brrrr From First Principles", 2022). 20 us puts Llama-2-7B on
an A100-80GB at ~29 ms per token in eager mode, between the 39 ms (25.5 tokens/s) that PyTorch's
"GPT, Fast" blog (2023) measured for plain eager code and the 9.5 ms (104.9 tokens/s, 1.40 TB/s)
its compiled, launch-free version reached."""

SMALL_KERNELS_PER_BLOCK = 28
"""Kernel-launching ops of one decoder block per decode step besides its Linears and its
attention call, counted with TorchDispatchMode on a real Hugging Face LlamaDecoderLayer
(transformers 5.x, one new token with a KV cache): 2 RMSNorms (pow, mean, add, rsqrt, mul,
mul each), rotary (mul x4, neg x2, cat x2, add x2), the KV-cache cat x2, SiLU, the gate
product and 2 residual adds; the view and transpose ops that launch nothing are left out.
tests/test_infer.py recounts them."""


class InferencePlacement(BaseModel):
    """A device map and what it costs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    device_map: dict[str, int]
    gpus_used: int
    memory_per_gpu_gib: tuple[float, ...]
    memory_limit_gib: float
    time_per_token_s: float
    tokens_per_s: float


def kv_cache_bytes(layer: Layer, *, context_len: int, batch: int) -> float:
    """Keys and values of every attention call of the layer for ``context_len`` tokens."""
    return sum(2 * batch * context_len * a.num_kv_heads * a.head_dim * WEIGHT_BYTES
               for a in layer.attention)


def _layer_bytes(layer: Layer, context_len: int, batch: int) -> float:
    return layer.num_params * WEIGHT_BYTES + kv_cache_bytes(layer, context_len=context_len,
                                                            batch=batch)


def _expert_bytes_read(layer: Layer, batch: int) -> float:
    """Bytes of expert weights a decode step reads: only the experts its ``batch`` tokens are
    routed to, ``num_experts * (1 - (1 - top_k/num_experts) ** batch)`` of them on average
    (each token picks ``top_k`` experts, balanced)."""
    total = 0.0
    for e in layer.experts:
        hit = e.num_experts * (1.0 - (1.0 - e.top_k / e.num_experts) ** batch)
        total += hit * e.params_per_expert * WEIGHT_BYTES
    return total


def _launched(work_s: float) -> float:
    """Seconds of one kernel: its work, or its launch when the host is slower."""
    return max(KERNEL_LAUNCH_S, work_s)


def decode_time(layer: Layer, *, context_len: int, batch: int, bandwidth_Bps: float) -> float:
    """Seconds of one decode step through ``layer`` on a GPU streaming ``bandwidth_Bps``: one
    kernel per Linear application (its weights), one per attention call (its KV cache), a
    block's small kernels (the remaining parameters and the per-token activations, well under
    a launch each), all bound below by their launch."""
    experts = {e.name for e in layer.experts}
    dense = [g for g in layer.gemms if not any(g.name.startswith(name) for name in experts)]
    seconds = sum(g.count * _launched(g.weight_params * WEIGHT_BYTES / bandwidth_Bps) for g in dense)
    if layer.experts:
        seconds += _launched(_expert_bytes_read(layer, batch) / bandwidth_Bps)
    kv = kv_cache_bytes(layer, context_len=context_len, batch=batch)
    seconds += len(layer.attention) * _launched(kv / max(1, len(layer.attention)) / bandwidth_Bps)
    in_gemms = sum(g.weight_params for g in dense) + sum(
        e.num_experts * e.params_per_expert for e in layer.experts)
    rest = 0.0 if layer.kind is LayerKind.EMBEDDING else max(0, layer.num_params - in_gemms)
    small = SMALL_KERNELS_PER_BLOCK if layer.kind is LayerKind.BLOCK else 1
    return seconds + max(small * KERNEL_LAUNCH_S, rest * WEIGHT_BYTES / bandwidth_Bps)


def _assign(graph: LayerGraph, cluster: Cluster, limit_bytes: float, context_len: int,
            batch: int) -> list[int]:
    """GPU index of each layer, filling GPUs in order."""
    devices, gpu, used = [], 0, INFERENCE_CONTEXT_BYTES
    for layer in graph.layers:
        need = _layer_bytes(layer, context_len, batch)
        if used + need > limit_bytes and used > INFERENCE_CONTEXT_BYTES:
            gpu, used = gpu + 1, INFERENCE_CONTEXT_BYTES
        if gpu >= cluster.num_gpus or used + need > limit_bytes:
            raise InfeasibleError(
                f"the model does not fit for inference on {cluster.num_gpus} x "
                f"{cluster.gpu.name}: layer {layer.name} needs {need / GIB:.1f} GiB of weights and "
                f"KV cache ({context_len} tokens x batch {batch}) beyond what is left of "
                f"{limit_bytes / GIB:.1f} GiB per GPU. Use more or larger GPUs, a shorter "
                "context or a smaller batch.")
        devices.append(gpu)
        used += need
    return devices


def place_for_inference(graph: LayerGraph, cluster: Cluster, *, context_len: int, batch: int = 1,
                        mem_limit_bytes: float | None = None) -> InferencePlacement:
    """The device map of ``graph`` on ``cluster`` and its predicted time per generated token."""
    limit = mem_limit_bytes or cluster.gpu.memory_bytes
    devices = _assign(graph, cluster, limit, context_len, batch)
    profile = compute_profile(cluster.gpu.name)
    bandwidth = cluster.gpu.memory_bandwidth_Bps * profile.memory_efficiency
    memory = [INFERENCE_CONTEXT_BYTES] * (max(devices) + 1)
    seconds = 0.0
    for layer, device in zip(graph.layers, devices):
        memory[device] += _layer_bytes(layer, context_len, batch)
        seconds += decode_time(layer, context_len=context_len, batch=batch,
                               bandwidth_Bps=bandwidth)
    hidden = graph.dims.hidden_size * batch * WEIGHT_BYTES if graph.dims else 0.0
    hops = sum(1 for a, b in zip(devices, devices[1:]) if a != b)
    if hops:
        seconds += hops * comm.p2p_time(hidden, group_links(cluster, 2, 1))
    device_map = {name: device for layer, device in zip(graph.layers, devices)
                  for name in layer.modules}
    return InferencePlacement(
        device_map=device_map, gpus_used=len(memory),
        memory_per_gpu_gib=tuple(m / GIB for m in memory), memory_limit_gib=limit / GIB,
        time_per_token_s=seconds, tokens_per_s=batch / seconds)
