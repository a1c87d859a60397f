"""Collective communication times on placed groups (alpha-beta model with NCCL's size curve).

A ring collective over n ranks moves ``2(n-1)/n * S`` (all-reduce) or ``(n-1)/n * S``
(reduce-scatter, all-gather) per rank at the group's bus bandwidth (nccl-tests' busbw
convention, nccl-tests doc/PERFORMANCE.md). The bus bandwidth is the bottleneck of the links
the group crosses:
- inside a node, the GPU's NVLink/PCIe bandwidth times the link's plateau efficiency;
- across nodes, the NIC bandwidth the group's members in a node share: all GPUs of a node
  communicate at once (every rank is in a group of the same kind), so each gets
  ``nics * nic_bw / gpus_per_node`` and a group with k members per node gets k times that
  (nccl-tests issue 119: 4 HDR per node -> ~100 GB/s busbw for whole-node groups);
- across leaf switches, that divided by the fabric's oversubscription: NCCL orders rings by
  rank, not by leaf, and every group of the axis communicates at once, so the uplinks carry up
  to all of a leaf's traffic (the conservative bound; a ring laid out leaf by leaf would cross
  each uplink only twice).

Inside a node, time = alpha + bytes / (busbw * e(S)). alpha is NCCL's launch floor plus one hop
latency per step of the algorithm: ring 2(n-1) steps, tree 2*log2(n). e(S) is the fraction of
the plateau busbw a message of S bytes reaches, fitted to the DGX H100 all_reduce_perf curve
(README 4.2) and, assuming a fixed per-chunk overhead, shifted with the link's bandwidth: a link
k times slower reaches the same efficiency at a k times smaller message.

Across nodes, all-reduce, reduce-scatter and all-gather take NCCL's own tuning model
(costmodels.nccl_tuning) on the plateau busbw above: the latency of every ring step (of which
2(nodes-1) cross the network) or tree level, each protocol's bandwidth (LL, LL128, Simple), the
tree's bandwidth loss at medium sizes, the latency the network plugin adds per network step
(EFA's 75 us), and the fastest choice, as NCCL's tuner makes it. A measured profile
(autoplan/cluster/profile.py) replaces busbw*e(S) and alpha, or the tuning model, by its table.
"""

from __future__ import annotations

import bisect
import math

from autoplan.cluster.topology import GroupLinks
from autoplan.costmodels import nccl_tuning

NCCL_BASE_LATENCY_S = 9e-6
"""[Empirical] launch floor: with 2*log2(8)=6 NVLink hops of 1 us it gives the 13-17 us of an
8-GPU nccl-tests all-reduce of 8 B-2 KB (dgxc-benchmarking nccl README, README 4.2)."""

EFFICIENCY_REFERENCE_BPS = 480e9
"""The plateau busbw of the curve below (DGX H100, 8-16 GB messages, README 4.2)."""

EFFICIENCY_BY_SIZE = ((2**20, 0.319), (2**24, 0.562), (2**27, 0.858), (2**30, 0.975),
                      (2**33, 1.0))
"""[Empirical] (message bytes, fraction of plateau busbw) at EFFICIENCY_REFERENCE_BPS, fitted to
the DGX H100 all_reduce_perf busbw (67, 237, 401, 466, 480 GB/s at 1 MB, 16 MB, 128 MB, 1 GB,
8 GB; README 4.2) after taking off a 15 us alpha: e = x / (480 GB/s * (t - 15 us))."""

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")


def size_efficiency(message_bytes: float, plateau_Bps: float) -> float:
    """Fraction of the plateau busbw reached by a message of ``message_bytes`` on a link whose
    plateau is ``plateau_Bps`` (interpolated in log size, clamped at the table's ends)."""
    scaled = message_bytes * EFFICIENCY_REFERENCE_BPS / plateau_Bps
    sizes = [s for s, _ in EFFICIENCY_BY_SIZE]
    if scaled <= sizes[0]:
        return EFFICIENCY_BY_SIZE[0][1]
    if scaled >= sizes[-1]:
        return 1.0
    i = bisect.bisect_right(sizes, scaled)
    (s0, e0), (s1, e1) = EFFICIENCY_BY_SIZE[i - 1], EFFICIENCY_BY_SIZE[i]
    return e0 + (e1 - e0) * math.log(scaled / s0) / math.log(s1 / s0)


def _intra_plateau(links: GroupLinks) -> float:
    return links.intra_bandwidth * links.intra_efficiency


def _inter_plateau(links: GroupLinks, members: int) -> float:
    return members * links.nic_bandwidth_per_gpu * links.inter_efficiency / links.uplink_slowdown


def bus_bandwidth(links: GroupLinks, *, message_bytes: float | None = None) -> float:
    """Bus bandwidth (bytes/s) of a ring over the group: the plateau for large messages, or what
    a message of ``message_bytes`` reaches (measured profile first, else the size curve)."""
    measured = _measured_busbw(links, message_bytes) if message_bytes else None
    if measured is not None:
        return measured
    intra = _intra_plateau(links)
    if links.crosses_nodes:
        inter = _inter_plateau(links, links.members_per_node)
        plateau = min(intra, inter) if links.members_per_node > 1 else inter
    else:
        plateau = intra
    if message_bytes is None:
        return plateau
    return plateau * size_efficiency(message_bytes, plateau)


def _measured_busbw(links: GroupLinks, message_bytes: float) -> float | None:
    """busbw from the profile's table for the group's link class; None without one."""
    profile = links.profile
    if profile is None:
        return None
    if not links.crosses_nodes:
        return None if profile.intra is None else profile.intra.at(message_bytes)
    busbw = profile.inter_busbw(message_bytes, links.num_nodes)
    if busbw is None:
        return None
    # measured with whole nodes: this group has its share of the NICs
    share = links.members_per_node / (links.gpus_per_node or links.members_per_node)
    busbw = busbw * share / links.uplink_slowdown
    if links.members_per_node > 1:
        busbw = min(busbw, _intra_busbw(links, message_bytes))
    return busbw


def _intra_busbw(links: GroupLinks, message_bytes: float) -> float:
    if links.profile is not None and links.profile.intra is not None:
        return links.profile.intra.at(message_bytes)
    plateau = _intra_plateau(links)
    return plateau * size_efficiency(message_bytes, plateau)


def _hop(links: GroupLinks) -> float:
    return links.inter_latency if links.crosses_nodes else links.intra_latency


def _alpha(links: GroupLinks, steps: int) -> float:
    if links.profile is not None and _measured_busbw(links, 1.0) is not None:
        return 0.0  # the measured busbw already includes the latency
    return NCCL_BASE_LATENCY_S + steps * _hop(links)


def _tree_steps(n: int) -> int:
    return 2 * math.ceil(math.log2(max(n, 2)))


def _flat(bytes_per_rank: float, message_bytes: float, links: GroupLinks, steps: int) -> float:
    return _alpha(links, steps) + bytes_per_rank / bus_bandwidth(links, message_bytes=message_bytes)


def _hierarchical_all_reduce(message_bytes: float, links: GroupLinks) -> float:
    """Reduce-scatter inside each node, all-reduce of the 1/k shards across nodes, all-gather
    inside the node (the 2D scheme of Horovod/BlueConnect)."""
    k, nodes = links.members_per_node, links.num_nodes
    if k == 1 or nodes == 1:
        return _flat(2 * (links.size - 1) / links.size * message_bytes, message_bytes, links,
                     _tree_steps(links.size))
    intra = 2 * (k - 1) / k * message_bytes / _intra_busbw(links, message_bytes)
    shard = message_bytes / k
    plateau = _inter_plateau(links, 1)
    inter = 2 * (nodes - 1) / nodes * shard / (plateau * size_efficiency(shard, plateau))
    return 2 * NCCL_BASE_LATENCY_S + 2 * (k - 1) * links.intra_latency \
        + _tree_steps(nodes) * links.inter_latency + intra + inter


def all_reduce_time(message_bytes: float, links: GroupLinks, *, algorithm: str = "auto") -> float:
    """All-reduce of ``message_bytes`` held by every rank.

    Args:
        message_bytes: the buffer each rank holds (nccl-tests' "size").
        links: the group's placement (:func:`autoplan.cluster.topology.group_links`).
        algorithm: ``ring`` (2(n-1) latency steps), ``tree`` (2 log2 n steps, same bandwidth),
            ``hierarchical`` (intra-node reduce-scatter, inter-node all-reduce, all-gather), or
            ``auto``: the faster of ring and tree, as NCCL's tuner picks.

    Example:
        >>> all_reduce_time(2**30, group_links(dgx_a100, 8, 1))  # ~9.2 ms: ~204 GB/s busbw
    """
    n = links.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if algorithm == "hierarchical":
        return _hierarchical_all_reduce(message_bytes, links)
    if _tuned_across_nodes(links):
        return nccl_tuning.tuned_time(_collective("all_reduce", links), message_bytes,
                                      _checked(algorithm))
    volume = 2 * (n - 1) / n * message_bytes
    ring = _flat(volume, message_bytes, links, 2 * (n - 1))
    tree = _flat(volume, message_bytes, links, _tree_steps(n))
    return {"ring": ring, "tree": tree, "auto": min(ring, tree)}[_checked(algorithm)]


def _checked(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    return algorithm


def _tuned_across_nodes(links: GroupLinks) -> bool:
    """Whether NCCL's tuning model prices the group: it crosses nodes and no measured
    inter-node table stands in for it."""
    return links.crosses_nodes and (links.profile is None or links.profile.inter is None)


def _collective(kind: str, links: GroupLinks) -> nccl_tuning.Collective:
    """The group as NCCL's tuner sees it, with the links' plateau as its ring Simple busbw."""
    return nccl_tuning.Collective(
        kind=kind, ranks=links.size, nodes=links.num_nodes,
        intra="pci" if links.intra_kind == "pcie" else "nvlink",
        busbw=bus_bandwidth(links), net_latency_us=links.net_latency * 1e6,
        intra_busbw=_intra_plateau(links) if links.members_per_node > 1 else math.inf)


def reduce_scatter_time(message_bytes: float, links: GroupLinks, *, algorithm: str = "auto") -> float:
    """Reduce-scatter of ``message_bytes`` (the full, unsharded size) per rank (ring: n-1
    steps; ``tree``/``auto`` take NCCL's log-latency schedule)."""
    n = links.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if _tuned_across_nodes(links):
        chosen = "ring" if _checked(algorithm) in ("ring", "tree") else "auto"
        # NCCL prices reduce-scatter and all-gather alike; neither runs as a tree
        return nccl_tuning.tuned_time(_collective("reduce_scatter", links), message_bytes, chosen)
    steps = n - 1 if _checked(algorithm) == "ring" else min(n - 1, _tree_steps(n))
    return _flat((n - 1) / n * message_bytes, message_bytes, links, steps)


def all_gather_time(message_bytes: float, links: GroupLinks, *, algorithm: str = "auto") -> float:
    """All-gather producing ``message_bytes`` (the full size) on every rank."""
    return reduce_scatter_time(message_bytes, links, algorithm=algorithm)


def ring_latency(links: GroupLinks) -> float:
    """Latency of one ring all-gather or reduce-scatter over the group beyond its launch floor:
    NCCL runs these two as rings (its tree serves all-reduce), n - 1 steps of one hop; across
    nodes, the steps of NCCL's tuning model for Simple (nodes - 1 of them over the network)."""
    if _tuned_across_nodes(links):
        simple = nccl_tuning.PROTOCOLS.index("Simple")
        latency_us = nccl_tuning.latency_us(_collective("reduce_scatter", links), "ring", "Simple")
        return (latency_us - nccl_tuning.BASE_LATENCY_US["ring"][simple]) * 1e-6
    return (links.size - 1) * _hop(links)


def all_to_all_time(message_bytes: float, links: GroupLinks) -> float:
    """All-to-all where every rank holds ``message_bytes`` and sends 1/n of it to each peer.

    The ``(k-1)/n`` for peers in the node go over NVLink/PCIe while the ``(n-k)/n`` for other
    nodes go through the node's NICs (the GPU's share, thinner across leaves); both run at once,
    so the slower sets the time. Each peer's chunk is ``S/n``, which sets the size efficiency.
    """
    n, k = links.size, links.members_per_node
    if n <= 1 or message_bytes <= 0:
        return 0.0
    chunk = message_bytes / n
    intra = (k - 1) / n * message_bytes / _intra_busbw(links, chunk) if k > 1 else 0.0
    inter = 0.0
    if links.crosses_nodes:
        plateau = _inter_plateau(links, 1)
        inter = (n - k) / n * message_bytes / (plateau * size_efficiency(chunk, plateau))
    return NCCL_BASE_LATENCY_S + math.ceil(math.log2(n)) * _hop(links) + max(intra, inter)


def p2p_time(message_bytes: float, links: GroupLinks) -> float:
    """Point-to-point send between neighbouring pipeline stages (every GPU sends at once)."""
    if message_bytes <= 0 or links.size <= 1:
        return 0.0
    if links.crosses_nodes:
        plateau = _inter_plateau(links, 1)
        latency = links.inter_latency
    else:
        plateau = _intra_plateau(links)
        latency = links.intra_latency
    return NCCL_BASE_LATENCY_S + latency + message_bytes / (
        plateau * size_efficiency(message_bytes, plateau))


NETWORK_BOUND_SHARE = 0.5
"""A step is network-bound when exposed communication is at least this share of it: the links,
not the GPUs, then set the pace, and a faster fabric (not more GPUs) is what speeds it up."""

COMM_PARTS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")


def communication_share(estimate) -> float:
    """Exposed communication (TP, CP, EP, PP and DP/ZeRO collectives) as a share of the step time of an
    :class:`autoplan.plan.Estimate`."""
    parts = estimate.time_breakdown_s
    return sum(parts.get(k, 0.0) for k in COMM_PARTS) / estimate.step_time_s


def network_bound(estimate, *, share: float = NETWORK_BOUND_SHARE) -> bool:
    """True when communication dominates the step (see NETWORK_BOUND_SHARE).

    Example:
        >>> network_bound(autoplan.estimate(model, slow_cluster, pins, ...).estimate)
        True
    """
    return communication_share(estimate) >= share


SLOW_NETWORK_BPS = 100e9 / 8
"""Below 100 Gb/s per node-to-node path ZeRO-3's per-micro-batch gathers dominate (DESIGN.md:
a 65B model over 10 Gb/s Ethernet spends minutes per step on communication)."""


def slow_link_note(cluster, world_size: int) -> str | None:
    """A sentence for the report when the plan spans nodes joined by a link below
    SLOW_NETWORK_BPS per NIC (what ``explain`` warns about too); None otherwise."""
    inter = cluster.inter
    if inter is None or world_size <= cluster.gpus_per_node or inter.bandwidth_Bps >= SLOW_NETWORK_BPS:
        return None
    return (f"slow inter-node link: {inter.bandwidth_Bps * 8 / 1e9:g} Gb/s per NIC "
            f"({cluster.nics_per_node} per node) joins the {-(-world_size // cluster.gpus_per_node)} "
            "nodes this plan spans, below the 100 Gb/s where data-parallel and ZeRO traffic stop "
            "hiding behind compute; `autoplan explain` shows what a faster network would give.")


def network_note(estimate) -> str | None:
    """A sentence for the report when the step is network-bound; None otherwise."""
    if not network_bound(estimate):
        return None
    parts = estimate.time_breakdown_s
    worst = max(COMM_PARTS, key=lambda k: parts.get(k, 0.0))
    return (f"network-bound: communication is {communication_share(estimate):.0%} of the step "
            f"(mostly {worst.replace('_comm', '').upper()}); a faster fabric or a plan that keeps "
            "this traffic inside nodes will speed it up more than more GPUs.")
