"""The cluster as a networkx graph, and what a group of ranks placed on it can use.

Graph nodes (attribute ``kind``): ``gpu:<node>:<local>``; one ``switch:<node>`` per node (the
NVSwitch, NVLink mesh or PCIe switch joining its GPUs, kind ``nvswitch``/``nvlink``/``pcie``);
``cpu:<node>`` (host memory, when cluster.yaml gives a host bandwidth); ``nic:<node>:<i>``; and
the network: one ``fabric`` switch (``single-switch``), or ``leaf:<j>`` switches under
``spine:<k>`` switches (``fat-tree``; ``rail-optimized`` has one leaf per rail and block of nodes,
``leaf:<rail>:<j>``, so NIC i of every node in a block meets its peers in one hop). Edges carry
``bandwidth`` (bytes/s, per direction), ``latency`` (s) and ``link`` (catalog name). A leaf's
uplinks together carry ``1/oversubscription`` of its downlinks.

Collective costs (costmodels.comm) read a placed group's bottleneck from :func:`group_links`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from autoplan.cluster.profile import NcclProfile
from autoplan.cluster.spec import Cluster
from autoplan.records import kept_hash

if TYPE_CHECKING:
    import networkx as nx

SWITCH_LATENCY_S = 0.3e-6
"""Port-to-port latency of an InfiniBand/Ethernet switch hop (NVIDIA Quantum HDR/NDR datasheets
quote ~130-300 ns); drawn on leaf-spine edges."""


def _node_clusters(cluster: Cluster) -> list[tuple[int, Cluster]]:
    """(first global node index, homogeneous cluster) of each group (one for a plain cluster)."""
    out, first = [], 0
    for group in cluster.groups or (cluster,):
        out.append((first, group))
        first += group.num_nodes
    return out


def _leaf_name(cluster: Cluster, node: int, nic: int) -> str:
    fabric = cluster.fabric
    if fabric.kind == "single-switch":
        return "fabric"
    if fabric.kind == "rail-optimized":
        return f"leaf:{nic}:{fabric.leaf_of(node)}"
    return f"leaf:{fabric.leaf_of(node)}"


def _node_parts(cluster: Cluster, group: Cluster, node: int
                ) -> tuple[list[tuple[str, dict]], list[tuple[str, str, dict]]]:
    """The graph nodes (name, attributes) and edges (ends, attributes) of one cluster node:
    its GPUs, switch, host memory and NICs, each NIC joined to its leaf."""
    switch = f"switch:{node}"
    nodes = [(switch, {"kind": group.intra.kind, "node": node, "group": group.name})]
    edges = []
    for local in range(group.gpus_per_node):
        gpu = f"gpu:{node}:{local}"
        nodes.append((gpu, {"kind": "gpu", "node": node, "local": local, "gpu": group.gpu.name}))
        edges.append((gpu, switch, {"bandwidth": group.intra.bandwidth_Bps,
                                    "latency": group.intra.latency_s, "link": group.intra.name}))
    if group.host_bandwidth_Bps is not None:
        nodes.append((f"cpu:{node}", {"kind": "cpu", "node": node,
                                      "memory": group.cpu_memory_bytes}))
        edges.append((f"cpu:{node}", switch, {
            "link": "pcie", "latency": 0.0,
            "bandwidth": group.host_bandwidth_Bps * group.gpus_per_node}))
    if group.inter is None:
        return nodes, edges
    for i in range(group.nics_per_node):
        nic, leaf = f"nic:{node}:{i}", _leaf_name(cluster, node, i)
        nodes.append((nic, {"kind": "nic", "node": node}))
        nodes.append((leaf, {"kind": "leaf" if leaf != "fabric" else "single-switch"}))
        edges.append((nic, switch, {"bandwidth": group.inter.bandwidth_Bps, "latency": 0.0,
                                    "link": "pcie"}))
        edges.append((nic, leaf, {"bandwidth": group.inter.bandwidth_Bps,
                                  "latency": group.inter.latency_s, "link": group.inter.name}))
    return nodes, edges


def _add_spines(graph: nx.Graph, cluster: Cluster) -> None:
    """Join the leaves through spines; each leaf's uplinks carry its downlink / oversubscription."""
    leaves = [n for n, d in graph.nodes(data=True) if d["kind"] == "leaf"]
    if len(leaves) < 2:
        return
    num_spines = max(1, cluster.nics_per_node)
    for leaf in leaves:
        down = sum(graph.edges[leaf, nic]["bandwidth"] for nic in graph.neighbors(leaf))
        for k in range(num_spines):
            spine = f"spine:{k}"
            graph.add_node(spine, kind="spine")
            graph.add_edge(leaf, spine, latency=SWITCH_LATENCY_S, link="uplink",
                           bandwidth=down / cluster.fabric.oversubscription / num_spines)


def build_topology(cluster: Cluster) -> nx.Graph:
    """The topology graph; GPU g of a node uses NIC ``g * nics // gpus_per_node``.

    Example:
        >>> graph = build_topology(cluster)
        >>> graph.edges["gpu:0:0", "switch:0"]["bandwidth"]
        300000000000.0
    """
    import networkx as nx  # only the commands that draw or summarize the graph need it

    graph = nx.Graph(name=cluster.name)
    for first, group in _node_clusters(cluster):
        for node in range(first, first + group.num_nodes):
            nodes, edges = _node_parts(cluster, group, node)
            graph.add_nodes_from(nodes)
            graph.add_edges_from(edges)
    _add_spines(graph, cluster)
    return graph


@dataclass(frozen=True, slots=True)
class GroupLinks:
    """What one communicator group of a plan can use.

    ``members_per_node`` ranks of the group share each of its ``num_nodes`` nodes. Every GPU of a
    node is in some group of the same kind and they communicate at once, so a node's NICs are
    shared by all its GPUs: each GPU gets ``nic_bandwidth_per_gpu``. A group whose nodes sit under
    ``num_leaves`` > 1 leaf switches crosses the leaf uplinks, ``oversubscription`` times thinner.
    ``intra_kind`` is the node's link kind (``nvswitch``, ``nvlink``, ``pcie``); ``net_latency``
    the seconds the network plugin reports to NCCL's tuner per network step (0 for NCCL's own
    InfiniBand and socket transports).
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
    gpus_per_node: int = 0
    num_leaves: int = 1
    oversubscription: float = 1.0
    profile: NcclProfile | None = None
    intra_kind: str = "nvswitch"
    net_latency: float = 0.0
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return kept_hash(self)

    @property
    def crosses_nodes(self) -> bool:
        return self.num_nodes > 1

    @property
    def crosses_leaves(self) -> bool:
        return self.num_leaves > 1

    @property
    def uplink_slowdown(self) -> float:
        """Factor by which the network is slower for this group (1 inside one leaf)."""
        return self.oversubscription if self.crosses_leaves else 1.0


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
def group_leaves(gpus_per_node: int, size: int, stride: int, nodes_per_leaf: int) -> int:
    """Leaf switches under the nodes of the first group (ranks 0, stride, ...); the other groups
    of the same axis are shifted copies of it, aligned the same way when blocks of nodes
    divide evenly, which is how planners place them."""
    return len({(k * stride) // gpus_per_node // nodes_per_leaf for k in range(size)})


@lru_cache(maxsize=4096)
def _node_links(cluster: Cluster) -> tuple[float, float, float, float]:
    """(intra bandwidth per GPU, intra latency, NIC bandwidth per GPU, inter latency) from the
    edges of node 0 (all nodes of a homogeneous cluster are alike), without building the
    graph (and importing networkx) for it."""
    first = cluster.groups[0] if cluster.groups else cluster
    one = replace(first, num_nodes=1, hosts=(), groups=())
    edges = {(a, b): data for a, b, data in _node_parts(one, one, 0)[1]}
    gpu_edges = [edges["gpu:0:%d" % g, "switch:0"] for g in range(cluster.gpus_per_node)]
    intra_bw = min(e["bandwidth"] for e in gpu_edges)
    intra_lat = max(e["latency"] for e in gpu_edges)
    nic_edges = [edges[f"nic:0:{i}", _leaf_name(one, 0, i)] for i in range(cluster.nics_per_node)]
    nic_total = sum(e["bandwidth"] for e in nic_edges)
    inter_lat = max((e["latency"] for e in nic_edges), default=0.0)
    return intra_bw, intra_lat, nic_total / cluster.gpus_per_node, inter_lat


def group_links(cluster: Cluster, size: int, stride: int, *,
                profile: NcclProfile | None = None) -> GroupLinks:
    """The links a group of ``size`` ranks spaced ``stride`` apart crosses.

    Args:
        cluster: the (homogeneous) cluster.
        size: ranks in the group.
        stride: rank distance between consecutive members (the product of the sizes of the
            mesh axes placed inside this one).
        profile: measured busbw curves overriding ``cluster.nccl_profile``.
    """
    per_node, nodes = group_placement(cluster.gpus_per_node, size, stride)
    intra_bw, intra_lat, nic_per_gpu, inter_lat = _node_links(cluster)
    inter = cluster.inter
    leaves = group_leaves(cluster.gpus_per_node, size, stride, cluster.fabric.nodes_per_leaf) \
        if nodes > 1 else 1
    hops = 2 if leaves > 1 else 0  # up to a spine and down again
    return GroupLinks(
        size=size, members_per_node=per_node, num_nodes=nodes,
        intra_bandwidth=intra_bw, intra_efficiency=cluster.intra.allreduce_efficiency,
        intra_latency=intra_lat, nic_bandwidth_per_gpu=nic_per_gpu,
        inter_efficiency=inter.efficiency_at(nodes) if inter else 1.0,
        inter_latency=inter_lat + hops * SWITCH_LATENCY_S,
        gpus_per_node=cluster.gpus_per_node, num_leaves=leaves,
        oversubscription=cluster.fabric.oversubscription,
        profile=profile if profile is not None else cluster.nccl_profile,
        intra_kind=cluster.intra.kind,
        net_latency=inter.nccl_net_latency_s if inter else 0.0,
    )


def summary(cluster: Cluster, graph: nx.Graph | None = None) -> dict:
    """Counts and headline bandwidths of a cluster's graph (what ``autoplan topo`` prints)."""
    graph = graph if graph is not None else build_topology(cluster)
    kinds: dict[str, int] = {}
    for _, data in graph.nodes(data=True):
        kinds[data["kind"]] = kinds.get(data["kind"], 0) + 1
    return {
        "name": cluster.name, "nodes": cluster.num_nodes, "gpus": cluster.num_gpus,
        "graph_nodes": graph.number_of_nodes(), "graph_edges": graph.number_of_edges(),
        "by_kind": dict(sorted(kinds.items())),
        "leaves": math.ceil(cluster.num_nodes / cluster.fabric.nodes_per_leaf),
    }
