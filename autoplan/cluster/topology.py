"""The cluster as a networkx graph, and what a group of ranks placed on it can use.

Nodes: ``gpu:<node>:<local>``, one ``switch:<node>`` (NVSwitch or PCIe switch) per node,
``nic:<node>:<i>``, and one ``fabric`` switch joining the NICs. Edges carry ``bandwidth``
(bytes/s, per direction) and ``latency`` (s). Collective costs (costmodels.comm) read the
bottleneck of a placed group from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import networkx as nx

from autoplan.cluster.spec import Cluster


def build_topology(cluster: Cluster) -> nx.Graph:
    """The topology graph; GPU g of a node uses NIC ``g * nics // gpus_per_node``."""
    graph = nx.Graph(name=cluster.name)
    for node in range(cluster.num_nodes):
        switch = f"switch:{node}"
        graph.add_node(switch, kind=cluster.intra.kind)
        for local in range(cluster.gpus_per_node):
            gpu = f"gpu:{node}:{local}"
            graph.add_node(gpu, kind="gpu", node=node, local=local)
            graph.add_edge(gpu, switch, bandwidth=cluster.intra.bandwidth_Bps,
                           latency=cluster.intra.latency_s, link=cluster.intra.name)
        if cluster.inter is None:
            continue
        for i in range(cluster.nics_per_node):
            nic = f"nic:{node}:{i}"
            graph.add_node(nic, kind="nic", node=node)
            graph.add_edge(nic, switch, bandwidth=cluster.inter.bandwidth_Bps, latency=0.0,
                           link="pcie")
            graph.add_edge(nic, "fabric", bandwidth=cluster.inter.bandwidth_Bps,
                           latency=cluster.inter.latency_s, link=cluster.inter.name)
    return graph


@dataclass(frozen=True, slots=True)
class GroupLinks:
    """What one communicator group of a plan can use.

    ``members_per_node`` ranks of the group share each of its ``num_nodes`` nodes. Every GPU of a
    node is in some group of the same kind and they communicate at once, so a node's NICs are
    shared by all its GPUs: each GPU gets ``nic_bandwidth_per_gpu``.
    """

    size: int
    members_per_node: int
    num_nodes: int
    intra_bandwidth: float
    intra_efficiency: float
    intra_latency: float
    nic_bandwidth_per_gpu: float
    inter_efficiency: float
    inter_latency: float

    @property
    def crosses_nodes(self) -> bool:
        return self.num_nodes > 1


def group_placement(gpus_per_node: int, size: int, stride: int) -> tuple[int, int]:
    """(members per node, nodes spanned) of a group of ``size`` ranks spaced ``stride`` apart
    when ranks fill nodes in order."""
    if size <= 1:
        return 1, 1
    if stride >= gpus_per_node:
        return 1, size
    per_node = max(1, min(size, gpus_per_node // stride))
    return per_node, -(-size // per_node)


@lru_cache(maxsize=4096)
def _node_links(cluster: Cluster) -> tuple[float, float, float, float]:
    """(intra bandwidth per GPU, intra latency, NIC bandwidth per GPU, inter latency) from the
    graph's edges of node 0 (all nodes are alike)."""
    graph = build_topology_for_node(cluster)
    gpu_edges = [graph.edges["gpu:0:%d" % g, "switch:0"] for g in range(cluster.gpus_per_node)]
    intra_bw = min(e["bandwidth"] for e in gpu_edges)
    intra_lat = max(e["latency"] for e in gpu_edges)
    nic_edges = [graph.edges[f"nic:0:{i}", "fabric"] for i in range(cluster.nics_per_node)]
    nic_total = sum(e["bandwidth"] for e in nic_edges)
    inter_lat = max((e["latency"] for e in nic_edges), default=0.0)
    return intra_bw, intra_lat, nic_total / cluster.gpus_per_node, inter_lat


def build_topology_for_node(cluster: Cluster) -> nx.Graph:
    """The graph of one node and its NICs (what group costs need; nodes are identical)."""
    return build_topology(replace(cluster, num_nodes=1, hosts=()))


def group_links(cluster: Cluster, size: int, stride: int) -> GroupLinks:
    """The links a group of ``size`` ranks spaced ``stride`` apart crosses."""
    per_node, nodes = group_placement(cluster.gpus_per_node, size, stride)
    intra_bw, intra_lat, nic_per_gpu, inter_lat = _node_links(cluster)
    inter = cluster.inter
    return GroupLinks(
        size=size, members_per_node=per_node, num_nodes=nodes,
        intra_bandwidth=intra_bw, intra_efficiency=cluster.intra.allreduce_efficiency,
        intra_latency=intra_lat, nic_bandwidth_per_gpu=nic_per_gpu,
        inter_efficiency=inter.allreduce_efficiency if inter else 1.0, inter_latency=inter_lat,
    )
