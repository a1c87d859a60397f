"""Inference placement for Hugging Face ``device_map``: which GPU holds which layer, and the
predicted time per generated token.

Layers are placed in order, each GPU filled up to its memory limit before the next is used
(the fewest GPUs; HF runs the layers of a device map one after another anyway). A layer needs
its weights and its KV cache (2 tensors x batch x context x KV heads x head dim, 16-bit).
Decoding one token reads every weight and the whole KV cache once, so it is bound by memory
bandwidth: per layer ``bytes / (HBM bandwidth x achieved efficiency)`` plus a fixed host cost
of launching the layer's kernels, plus a hop between GPUs where the map changes device.
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

DECODE_LAYER_OVERHEAD_S = 2.5e-4
"""[Empirical] host time to launch one decoder layer's ~15 kernels in eager PyTorch (about
15 us each incl. Python dispatch), which dominates small models at batch 1."""


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
        size = _layer_bytes(layer, context_len, batch)
        memory[device] += size
        seconds += size / bandwidth
        seconds += DECODE_LAYER_OVERHEAD_S if layer.kind is LayerKind.BLOCK else 0.0
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
