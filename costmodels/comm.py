"""Collective communication times on placed groups (alpha-beta model, NCCL ring).

A ring collective over n ranks moves ``2(n-1)/n * S`` (all-reduce) or ``(n-1)/n * S``
(reduce-scatter, all-gather) per rank at the group's bus bandwidth (nccl-tests' busbw
convention). The bus bandwidth is the bottleneck of the links the group crosses:
- inside a node, the GPU's NVLink/PCIe bandwidth times the link's achieved efficiency;
- across nodes, the NIC bandwidth the group's members in a node share: all GPUs of a node
  communicate at once (every rank is in a group of the same kind), so each gets
  ``nics * nic_bw / gpus_per_node`` and a group with k members per node gets k times that
  (nccl-tests issue 119: 4 HDR per node -> ~100 GB/s busbw for whole-node groups).
Small messages pay a fixed NCCL launch latency plus one link latency per ring step, and reach
full bandwidth only above ``HALF_BANDWIDTH_BYTES``.
"""

from __future__ import annotations

import math

from autoplan.cluster.topology import GroupLinks

NCCL_BASE_LATENCY_S = 15e-6
"""[Empirical] floor of an 8-GPU nccl-tests all-reduce (13-17 us, dgxc-benchmarking nccl README)."""

HALF_BANDWIDTH_BYTES = 8 * 2**20
"""[Empirical] message size at which NCCL's busbw reaches about half its peak growth: fits the
DGX H100 busbw curve of dgxc-benchmarking (237 GB/s at 16 MB, 401 at 128 MB, 466 at 1 GB)."""


def bus_bandwidth(links: GroupLinks) -> float:
    """Large-message bus bandwidth (bytes/s) of a ring over the group."""
    intra = links.intra_bandwidth * links.intra_efficiency
    if not links.crosses_nodes:
        return intra
    inter = links.members_per_node * links.nic_bandwidth_per_gpu * links.inter_efficiency
    return min(intra, inter) if links.members_per_node > 1 else inter


def _latency(links: GroupLinks, steps: int) -> float:
    hop = links.inter_latency if links.crosses_nodes else links.intra_latency
    # NCCL switches from ring to tree at scale: latency grows with log2(n), not n.
    return NCCL_BASE_LATENCY_S + min(steps, 2 * math.ceil(math.log2(max(links.size, 2)))) * hop


def _ring(bytes_per_rank: float, message_bytes: float, links: GroupLinks, steps: int) -> float:
    if links.size <= 1 or message_bytes <= 0:
        return 0.0
    ramp = 1.0 + HALF_BANDWIDTH_BYTES / message_bytes
    return _latency(links, steps) + bytes_per_rank * ramp / bus_bandwidth(links)


def all_reduce_time(message_bytes: float, links: GroupLinks) -> float:
    """Ring all-reduce of ``message_bytes`` held by every rank."""
    n = links.size
    return _ring(2 * (n - 1) / n * message_bytes, message_bytes, links, 2 * (n - 1))


def reduce_scatter_time(message_bytes: float, links: GroupLinks) -> float:
    """Reduce-scatter of ``message_bytes`` (the full, unsharded size) per rank."""
    n = links.size
    return _ring((n - 1) / n * message_bytes, message_bytes, links, n - 1)


def all_gather_time(message_bytes: float, links: GroupLinks) -> float:
    """All-gather producing ``message_bytes`` (the full size) on every rank."""
    return reduce_scatter_time(message_bytes, links)


def p2p_time(message_bytes: float, links: GroupLinks) -> float:
    """Point-to-point send between neighbouring pipeline stages (every GPU sends at once)."""
    if message_bytes <= 0 or links.size <= 1:
        return 0.0
    if links.crosses_nodes:
        bandwidth = links.nic_bandwidth_per_gpu * links.inter_efficiency
        latency = links.inter_latency
    else:
        bandwidth = links.intra_bandwidth * links.intra_efficiency
        latency = links.intra_latency
    return NCCL_BASE_LATENCY_S + latency + message_bytes / bandwidth
