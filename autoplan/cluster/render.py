"""What ``autoplan topo`` shows: a rich summary of a cluster and a PNG of its topology graph.

Small clusters (up to FULL_DRAWING_MAX_GPUS) are drawn vertex by vertex; larger ones are drawn
summarised, one vertex per node (or per leaf's block of nodes past SUMMARY_MAX_NODES), so the
picture stays readable at thousands of GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from rich.console import Console
from rich.table import Table

from autoplan.cluster.spec import Cluster
from autoplan.cluster.topology import build_topology, group_links, summary
from autoplan.errors import OutputExistsError
from autoplan.files import check_writable_folder, refuse_existing, replacing, write_errors_as

FULL_DRAWING_MAX_GPUS = 64
SUMMARY_MAX_NODES = 32
ONE_GIB = 2**30

_LAYER = {"gpu": 0, "cpu": 1, "nvswitch": 1, "nvlink": 1, "pcie": 1, "nic": 2, "node": 2,
          "block": 2, "leaf": 3, "single-switch": 3, "spine": 4}
_COLOUR = {"gpu": "#76b900", "nic": "#4f81bd", "leaf": "#c0504d", "spine": "#8064a2",
           "single-switch": "#c0504d", "cpu": "#f79646", "node": "#9bbb59", "block": "#9bbb59",
           "nvswitch": "#7f7f7f", "nvlink": "#7f7f7f", "pcie": "#7f7f7f"}
_KIND_NAME = {"gpu": "GPU", "nvswitch": "NVSwitch of a node", "nvlink": "NVLink mesh of a node",
              "pcie": "PCIe switch of a node", "cpu": "host (CPU memory)", "nic": "NIC",
              "single-switch": "network switch", "leaf": "leaf switch", "spine": "spine switch",
              "node": "node (its GPUs, switch and NICs)", "block": "block of nodes"}
_SWITCH_NAME = {"nvswitch": "NVSwitch", "nvlink": "NVLink", "pcie": "PCIe sw"}
_ROLE_COLOUR = {"intra-node": "#76b900", "host link": "#f79646", "NIC to node switch": "#999999",
                "network": "#4f81bd", "leaf to spine": "#8064a2"}
EDGE_LABELS_ALL_UP_TO = 12
"""Label every edge of a drawing with at most this many; past it, one edge of each kind of link
(same role, same bandwidth), so the numbers stay readable."""


def _gbs(bps: float | None) -> str:
    """GB/s, whole above 10 (300 GB/s), three digits below (10 Gb/s Ethernet: 1.25 GB/s)."""
    if bps is None:
        return "-"
    gbs = bps / 1e9
    return f"{gbs:,.0f} GB/s" if gbs >= 10 else f"{gbs:.3g} GB/s"


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
        if name == vertex:
            small.add_node(name, kind=data["kind"])
            continue
        kind = "block" if by_block else "node"
        first, last = small.nodes[name]["nodes"] if name in small else (data["node"], data["node"])
        small.add_node(name, kind=kind, nodes=(min(first, data["node"]), max(last, data["node"])))
    for u, v, data in graph.edges(data=True):
        a, b = owner(u, graph.nodes[u]), owner(v, graph.nodes[v])
        if a == b:
            continue
        previous = small.edges[a, b]["bandwidth"] if small.has_edge(a, b) else 0.0
        small.add_edge(a, b, bandwidth=previous + data["bandwidth"], link=data["link"])
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


@dataclass(frozen=True)
class TopologyDrawing:
    """What ``topo --png`` draws: the graph (summarised past FULL_DRAWING_MAX_GPUS), where each
    vertex sits, its label, the bandwidth written on edges, and the legend's entries."""

    graph: nx.Graph
    positions: dict[str, tuple[float, float]]
    vertex_labels: dict[str, str]
    edge_labels: dict[tuple[str, str], str]
    legend: tuple[tuple[str, str, str], ...]
    """(marker 'vertex', 'link' or 'note', colour, text)."""
    title: str


def _group_at(cluster: Cluster, node: int) -> Cluster:
    """The (homogeneous) group that global node ``node`` belongs to."""
    for group in cluster.groups or (cluster,):
        if node < group.num_nodes:
            return group
        node -= group.num_nodes
    raise ValueError(f"node {node} is past the cluster's last node")


def _vertex_label(cluster: Cluster, vertex: str, data: dict) -> str:
    """A reader's name for a graph vertex (``switch:3`` -> ``node 3 NVSwitch``)."""
    kind, parts = data["kind"], vertex.split(":")[1:]
    if kind == "gpu":
        return f"GPU {parts[1]}" if cluster.num_nodes == 1 else f"GPU {parts[0]}:{parts[1]}"
    if kind in _SWITCH_NAME:
        return f"node {parts[0]}\n{_SWITCH_NAME[kind]}"
    if kind == "cpu":
        return f"host {parts[0]}"
    if kind == "nic":
        return f"NIC {parts[0]}:{parts[1]}"
    if kind in ("node", "block"):
        first, last = data["nodes"]
        gpus = sum(_group_at(cluster, n).gpus_per_node for n in range(first, last + 1))
        where = f"node {first}" if first == last else f"nodes {first}-{last}"
        return f"{where}\n{gpus} GPUs"
    if kind == "single-switch":
        return "network\nswitch"
    return {"leaf": "leaf", "spine": "spine"}[kind] + " " + ":".join(parts)


def _link_role(graph: nx.Graph, u: str, v: str) -> str:
    """What an edge joins, by its ends' kinds: a GPU to its node's switch, the host, a NIC to the
    node switch, a node (NIC or summarised node) to the network, a leaf to a spine."""
    kinds = {graph.nodes[u]["kind"], graph.nodes[v]["kind"]}
    if "gpu" in kinds:
        return "intra-node"
    if "cpu" in kinds:
        return "host link"
    if "nic" in kinds and kinds & _SWITCH_NAME.keys():
        return "NIC to node switch"
    return "leaf to spine" if kinds == {"leaf", "spine"} else "network"


def _edge_labels(graph: nx.Graph) -> dict[tuple[str, str], str]:
    """Bandwidth per direction on every edge of a small drawing, else on the first edge of each
    kind of link (same role, same bandwidth): the legend gives them all."""
    edges = list(graph.edges(data=True))
    seen, labels = set(), {}
    for u, v, data in edges:
        key = (_link_role(graph, u, v), data["bandwidth"])
        if len(edges) <= EDGE_LABELS_ALL_UP_TO or key not in seen:
            labels[(u, v)] = _gbs(data["bandwidth"])
        seen.add(key)
    return labels


def _legend(graph: nx.Graph, summarised: bool) -> tuple[tuple[str, str, str], ...]:
    """One entry per kind of vertex drawn, one per kind of link with its link name(s) and
    bandwidth(s)."""
    kinds = dict.fromkeys(d["kind"] for _, d in graph.nodes(data=True))
    entries = [("vertex", _COLOUR.get(k, "#7f7f7f"), _KIND_NAME.get(k, k)) for k in kinds]
    roles: dict[str, tuple[set, set]] = {}
    for u, v, data in graph.edges(data=True):
        names, bandwidths = roles.setdefault(_link_role(graph, u, v), (set(), set()))
        names.add(data.get("link") or "")
        bandwidths.add(data["bandwidth"])
    for role, (names, bandwidths) in roles.items():
        figures = ", ".join(_gbs(b) for b in sorted(bandwidths))
        entries.append(("link", _ROLE_COLOUR[role], f"{role} ({', '.join(sorted(names))}): {figures}"))
    note = ("GB/s per direction; a summarised vertex's edge adds up its links" if summarised
            else "GB/s per direction, per link")
    entries.append(("note", "white", note))
    return tuple(entries)


def _hardware_line(cluster: Cluster) -> str:
    """Per kind of node: GPUs, intra-node link and NICs (what a summarised drawing hides)."""
    lines = []
    for g in cluster.groups or (cluster,):
        nics = f", {g.nics_per_node} x {g.inter.name} NIC {_gbs(g.inter.bandwidth_Bps)}" if g.inter else ""
        name = f"{g.name}: " if cluster.groups else ""
        lines.append(f"{name}{g.num_nodes} x {g.gpus_per_node} {g.gpu.name}, {g.intra.name} "
                     f"{_gbs(g.intra.bandwidth_Bps)} per GPU{nics}")
    return "\n".join(lines)


def topology_drawing(cluster: Cluster) -> TopologyDrawing:
    """Lay out the topology graph for ``topo --png`` (summarised for large clusters)."""
    graph = build_topology(cluster)
    full = cluster.num_gpus <= FULL_DRAWING_MAX_GPUS
    shown = graph if full else summarised_graph(cluster, graph)
    for _, data in shown.nodes(data=True):
        data["layer"] = _LAYER.get(data["kind"], 2)
    nodes = f"{cluster.num_nodes} node{'s' if cluster.num_nodes != 1 else ''}"
    title = (f"{cluster.name}: {nodes}, {cluster.num_gpus} GPUs" + ("" if full else " (summarised)")
             + "\n" + _hardware_line(cluster))
    return TopologyDrawing(
        graph=shown, positions=_layered_layout(shown),
        vertex_labels={v: _vertex_label(cluster, v, d) for v, d in shown.nodes(data=True)},
        edge_labels=_edge_labels(shown), legend=_legend(shown, summarised=not full), title=title)


def _legend_handles(drawing: TopologyDrawing) -> list:
    from matplotlib.lines import Line2D

    style = {"vertex": {"marker": "o", "linestyle": "", "markersize": 8},
             "link": {"linewidth": 2}, "note": {"linestyle": ""}}
    return [Line2D([], [], color=colour, label=text, **style[marker])
            for marker, colour, text in drawing.legend]


def draw_png(cluster: Cluster, path: str | Path) -> Path:
    """Write a PNG of the topology (summarised for large clusters) with matplotlib's Agg backend:
    labelled vertices, bandwidths on edges, a legend of vertex and link kinds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawing = topology_drawing(cluster)
    shown = drawing.graph
    layers = [d["layer"] for _, d in shown.nodes(data=True)]
    widest = max(layers.count(layer) for layer in set(layers))
    fig, ax = plt.subplots(figsize=(min(40, 4 + 0.65 * widest), 6.5))
    colours = [_COLOUR.get(d["kind"], "#7f7f7f") for _, d in shown.nodes(data=True)]
    edge_colours = [_ROLE_COLOUR[_link_role(shown, u, v)] for u, v in shown.edges()]
    nx.draw_networkx_nodes(shown, drawing.positions, ax=ax, node_color=colours, node_size=160)
    nx.draw_networkx_edges(shown, drawing.positions, ax=ax, edge_color=edge_colours, alpha=0.7)
    above = {v: (x, y + 0.08) for v, (x, y) in drawing.positions.items()}
    nx.draw_networkx_labels(shown, above, labels=drawing.vertex_labels, ax=ax, font_size=6,
                            verticalalignment="bottom")
    nx.draw_networkx_edge_labels(shown, drawing.positions, edge_labels=drawing.edge_labels, ax=ax,
                                 font_size=5, rotate=False)
    ax.set_ylim(min(layers) - 0.3, max(layers) + 0.5)  # room for the top row's labels
    ax.set_title(drawing.title, fontsize=9)
    ax.legend(handles=_legend_handles(drawing), fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.axis("off")
    path = Path(path)
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def write_topology_png(cluster: Cluster, path: str | Path, *, force: bool = False) -> Path:
    """:func:`draw_png`, refusing a folder, an unwritable place or (without ``force``) an
    existing file."""
    path = Path(path)
    if path.is_dir():
        raise OutputExistsError(f"--png {path} is a folder; give the path of the PNG file to write.")
    check_writable_folder(path.parent, flag="--png")
    if not force:
        refuse_existing([path])
    with write_errors_as(OutputExistsError, "--png"):
        return draw_png(cluster, path)
