"""What ``autoplan topo`` shows: a rich summary of a cluster and a PNG of its topology graph.

Small clusters (up to FULL_DRAWING_MAX_GPUS) are drawn vertex by vertex; larger ones are drawn
summarised, one vertex per node (or per leaf's block of nodes past SUMMARY_MAX_NODES), so the
picture stays readable at thousands of GPUs.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
from rich.console import Console
from rich.table import Table

from autoplan.cluster.spec import Cluster
from autoplan.cluster.topology import build_topology, group_links, summary
from autoplan.files import replacing

FULL_DRAWING_MAX_GPUS = 64
SUMMARY_MAX_NODES = 32
ONE_GIB = 2**30

_LAYER = {"gpu": 0, "cpu": 1, "nvswitch": 1, "nvlink": 1, "pcie": 1, "nic": 2, "node": 2,
          "leaf": 3, "single-switch": 3, "block": 3, "spine": 4}
_COLOUR = {"gpu": "#76b900", "nic": "#4f81bd", "leaf": "#c0504d", "spine": "#8064a2",
           "single-switch": "#c0504d", "cpu": "#f79646", "node": "#76b900", "block": "#76b900"}


def _gbs(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e9:,.0f} GB/s"


def probe_groups(cluster: Cluster) -> list[tuple[str, int, int]]:
    """(label, size, stride) of the groups a reader asks about first: a node's GPUs, one GPU per
    node across all nodes (DP over whole-node TP), and every GPU; only groups of two or more
    (one GPU has nothing to all-reduce)."""
    probes = [(f"{cluster.gpus_per_node} GPUs in a node", cluster.gpus_per_node, 1)
              ] if cluster.gpus_per_node > 1 else []
    if cluster.num_nodes > 1:
        probes.append((f"1 GPU per node x {cluster.num_nodes} nodes", cluster.num_nodes,
                       cluster.gpus_per_node))
        probes.append((f"all {cluster.num_gpus} GPUs", cluster.num_gpus, 1))
    return probes


def render_summary(cluster: Cluster, console: Console) -> None:
    """Print the cluster's hardware, fabric and the all-reduce busbw of typical groups."""
    from autoplan.costmodels.comm import all_reduce_time  # costmodels import the cluster package

    info = summary(cluster)
    table = Table(title=f"{cluster.name}: {info['nodes']} nodes, {info['gpus']} GPUs")
    groups = cluster.groups or (cluster,)
    table.add_column("")
    for g in groups:
        table.add_column(g.name if cluster.groups else "per node")
    rows = {
        "nodes": [str(g.num_nodes) for g in groups],
        "GPUs": [f"{g.gpus_per_node} x {g.gpu.name}" for g in groups],
        "intra-node": [f"{g.intra.name}, {_gbs(g.intra.bandwidth_Bps)} per GPU" for g in groups],
        "NICs": [f"{g.nics_per_node} x {g.inter.name}, {_gbs(g.inter.bandwidth_Bps)}" if g.inter
                 else "-" for g in groups],
        "host memory": ["-" if g.cpu_memory_bytes is None else f"{g.cpu_memory_bytes / 1e9:,.0f} GB"
                        for g in groups],
        "host link": [f"{_gbs(g.host_bandwidth_Bps)} per GPU" if g.host_bandwidth_Bps else "-"
                      for g in groups],
    }
    for label, cells in rows.items():
        table.add_row(label, *cells)
    console.print(table)
    f = cluster.fabric
    console.print(f"fabric: {f.kind}, oversubscription {f.oversubscription:g}:1, "
                  f"{f.nodes_per_leaf} nodes per leaf, {info['leaves']} leaf block(s); graph: "
                  f"{info['graph_nodes']} vertices, {info['graph_edges']} edges "
                  + ", ".join(f"{n} {k}" for k, n in info["by_kind"].items()), highlight=False)
    if not cluster.is_homogeneous:
        console.print("groups differ: plans cannot span them yet; bandwidths below are for the "
                      f"first group ({cluster.groups[0].name})", highlight=False)
        cluster = cluster.groups[0]
    if not probe_groups(cluster):
        return
    probes = Table(title="all-reduce of 1 GiB (bus bandwidth, nccl-tests convention)")
    for column in ("group", "crosses", "busbw", "time"):
        probes.add_column(column)
    for label, size, stride in probe_groups(cluster):
        links = group_links(cluster, size, stride)
        t = all_reduce_time(ONE_GIB, links)
        crosses = "leaves" if links.crosses_leaves else "nodes" if links.crosses_nodes else "NVLink/PCIe only"
        probes.add_row(label, crosses, _gbs(2 * (size - 1) / size * ONE_GIB / t), f"{t * 1e3:.2f} ms")
    console.print(probes)


def summarised_graph(cluster: Cluster, graph: nx.Graph) -> nx.Graph:
    """One vertex per node (``node:<i>``) or, past SUMMARY_MAX_NODES, per leaf block
    (``block:<j>``), keeping the switches above; edge bandwidths add up."""
    by_block = cluster.num_nodes > SUMMARY_MAX_NODES
    per_block = cluster.fabric.nodes_per_leaf
    if per_block >= cluster.num_nodes:  # one leaf: cut the nodes into at most 16 blocks
        per_block = -(-cluster.num_nodes // 16)

    def owner(vertex: str, data: dict) -> str:
        if data["kind"] in ("leaf", "spine", "single-switch"):
            return vertex
        node = data["node"]
        if not by_block:
            return f"node:{node}"
        first = node // per_block * per_block
        return f"nodes:{first}-{min(first + per_block, cluster.num_nodes) - 1}"

    small = nx.Graph(name=graph.name)
    for vertex, data in graph.nodes(data=True):
        name = owner(vertex, data)
        kind = data["kind"] if name == vertex else ("block" if by_block else "node")
        small.add_node(name, kind=kind)
    for u, v, data in graph.edges(data=True):
        a, b = owner(u, graph.nodes[u]), owner(v, graph.nodes[v])
        if a == b:
            continue
        previous = small.edges[a, b]["bandwidth"] if small.has_edge(a, b) else 0.0
        small.add_edge(a, b, bandwidth=previous + data["bandwidth"])
    return small


def _order(vertex: str) -> tuple:
    """Natural order of ``kind:a:b`` names, so GPUs sit under their node's switch."""
    parts = vertex.replace("-", ":").split(":")[1:]
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def _layered_layout(graph: nx.Graph) -> dict:
    """Rows by layer (GPUs at the bottom, spines on top), vertices spread evenly in name order."""
    rows: dict[int, list[str]] = {}
    for vertex, data in graph.nodes(data=True):
        rows.setdefault(data["layer"], []).append(vertex)
    pos = {}
    for layer, vertices in rows.items():
        vertices.sort(key=_order)
        for i, vertex in enumerate(vertices):
            pos[vertex] = ((i + 0.5) / len(vertices), float(layer))
    return pos


def draw_png(cluster: Cluster, path: str | Path) -> Path:
    """Write a PNG of the topology (summarised for large clusters) with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graph = build_topology(cluster)
    full = cluster.num_gpus <= FULL_DRAWING_MAX_GPUS
    shown = graph if full else summarised_graph(cluster, graph)
    for _, data in shown.nodes(data=True):
        data["layer"] = _LAYER.get(data["kind"], 2)
    pos = _layered_layout(shown)
    fig, ax = plt.subplots(figsize=(min(40, 4 + 0.25 * shown.number_of_nodes()), 6))
    colours = [_COLOUR.get(d["kind"], "#7f7f7f") for _, d in shown.nodes(data=True)]
    nx.draw_networkx(shown, pos, ax=ax, node_color=colours, node_size=120 if full else 400,
                     with_labels=not full or shown.number_of_nodes() <= 40, font_size=6,
                     edge_color="#999999")
    if not full:
        labels = {(u, v): _gbs(d["bandwidth"]) for u, v, d in shown.edges(data=True)}
        if len(labels) <= 80:
            nx.draw_networkx_edge_labels(shown, pos, edge_labels=labels, ax=ax, font_size=5)
    ax.set_title(f"{cluster.name}: {cluster.num_nodes} nodes, {cluster.num_gpus} GPUs"
                 + ("" if full else " (summarised)"))
    ax.axis("off")
    path = Path(path)
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
