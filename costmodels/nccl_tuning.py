"""NCCL's own cost model of a collective across nodes, as its tuner computes it.

NCCL picks, for every collective call, the algorithm (ring, tree, PAT) and protocol (LL,
LL128, Simple) its model says is fastest: ``time = latency + bytes / bandwidth``
(``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NVIDIA/nccl src/graph/tuning.cc; the
constants below are that file's defaults, master of 2025). What this carries that a plain
alpha-beta model misses:
- latency grows with the steps of the algorithm: a ring all-reduce takes ``2(n-1)`` steps, of
  which ``2(nodes-1)`` cross the network (each paying the network's per-step latency, 14 us for
  Simple on InfiniBand) and the rest NVLink's; a tree ``2 log2(nodes)`` network steps;
- the protocols trade latency for bandwidth: LL (8-byte flags) halves the bandwidth and is
  capped at a few tens of GB/s across nodes, LL128 keeps 92% of it, Simple all of it at the
  highest latency (ring Simple across nodes pays another 1.4x once the message is large);
- a tree keeps 92% of the ring's bandwidth and loses more at medium sizes (its correction
  table: 0.5-0.7 between 32 KB and 8 MB); on one or two nodes tuning.cc takes the tree's
  bandwidth from its intra-node chains (``graphs[a]->bwIntra`` where ``nNodes <= 2``), which
  the topology search raises to up to twice the network's (search.cc "increase bwIntra for
  trees (2 nodes or collnet)"): between two nodes each byte of a tree all-reduce crosses the
  network once each way where a ring sends nearly two, so a tree of NVLink nodes all-reduces
  large messages up to twice as fast as the ring;
- the latency a network plugin reports (``props->latency``, NCCL's ``latencyInter``) is added
  to every network step (twice for Simple, its flush): 0 for NCCL's InfiniBand and socket
  transports, 75 us for EFA on p4d/p5/p5e as aws-ofi-nccl sets it (src/platform-aws.cpp).

``busbw`` is what the caller says the links give a ring with the Simple protocol (the
bottleneck of NVLink and the node's NIC share, autoplan.cluster.topology); NCCL derives the
same from its topology search. The per-channel caps (``perChMax*Bw`` times the channel count)
are left out: they do not bind on the NVLink/NDR nodes the channel counts are known for.
NVLS and NVLS-tree (NVLink SHARP across nodes) and CollNet (in-network reduction) are left
out too: they need switch support a cluster.yaml does not state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOLS = ("LL", "LL128", "Simple")

BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}
"""tuning.cc ``baseLatencies`` (LL, LL128, Simple), microseconds: a launch's fixed cost."""

HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "pat": (0.0, 0.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "pat": (0.0, 0.0, 14.0)},
}
"""tuning.cc ``hwLatencies`` (LL, LL128, Simple), microseconds per step over that link."""

LL_MAX_BUSBW = {2: 39.0e9, 3: 20.4e9}
"""tuning.cc ``llMaxBws`` for multi-node runs on Intel hosts (2 nodes; 3 or more): the LL
protocol's bus bandwidth ceiling, bytes/s."""

NET_OVERHEAD_US = 1.0
"""tuning.cc ``getNetOverhead`` on Intel x86 hosts (2.0 on AMD): the floor of every ring step
once a ring crosses nodes, tripled for Simple."""

RING_PLATEAU_FACTOR = 1.4
"""tuning.cc ``ncclTopoGetAlgoTime``: ring Simple all-reduce latency across nodes times 1.4 on
compute capability 8.0 and later (1.9 before) once each rank's chunk per channel is >= 64 B."""

MAX_CHANNELS = 32
"""NCCL's MAXCHANNELS: the most channels a message is split over (bounds the plateau test)."""

TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}
"""tuning.cc ``treeCorrectionFactor``: tree all-reduce bandwidth factor by log2(bytes / 64),
64 B to 256 MB (NCCL reads the first 23 entries)."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call as NCCL's tuner sees it.

    ``kind``: ``all_reduce``, ``reduce_scatter`` or ``all_gather``; ``ranks`` over ``nodes``
    nodes (the same number on each); ``intra``: ``nvlink`` or ``pci`` (the links inside a
    node); ``busbw``: the ring's Simple bus bandwidth (bytes/s); ``net_latency_us``: what the
    network plugin reports to NCCL; ``intra_busbw``: the bus bandwidth of the group's links
    inside a node (None: no faster than ``busbw``), which bounds a tree on two nodes."""

    kind: str
    ranks: int
    nodes: int
    intra: str
    busbw: float
    net_latency_us: float = 0.0
    intra_busbw: float | None = None

    @property
    def per_node(self) -> int:
        return self.ranks // self.nodes

    @property
    def steps(self) -> int:
        return 2 * (self.ranks - 1) if self.kind == "all_reduce" else self.ranks - 1


def log2i(n: int) -> int:
    """NCCL's log2i: floor(log2 n)."""
    return max(int(n).bit_length() - 1, 0)


def algorithms(c: Collective) -> tuple[str, ...]:
    """The algorithms NCCL considers: ring always; tree for all-reduce; PAT for reduce-scatter
    and all-gather with one rank per node (NCCL 2.23+)."""
    if c.kind == "all_reduce":
        return ("ring", "tree")
    return ("ring", "pat") if c.per_node == 1 else ("ring",)


def protocols(c: Collective, algorithm: str) -> tuple[str, ...]:
    """LL128 only where NVLink joins the node's GPUs (tuning.cc: typeIntra <= PATH_NVB); PAT
    runs Simple only."""
    if algorithm == "pat":
        return ("Simple",)
    return PROTOCOLS if c.intra == "nvlink" else ("LL", "Simple")


def latency_us(c: Collective, algorithm: str, protocol: str) -> float:
    """tuning.cc's latency of one call, microseconds."""
    p = PROTOCOLS.index(protocol)
    base = BASE_LATENCY_US[algorithm][p]
    intra = HW_LATENCY_US[c.intra][algorithm][p]
    net = HW_LATENCY_US["net"]["tree" if c.per_node == 1 else algorithm][p]
    inter = net + c.net_latency_us * (2 if protocol == "Simple" else 1)
    if algorithm == "ring":
        if c.nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
        crossing = 0 if c.nodes == 1 else (2 if c.kind == "all_reduce" else 1) * (c.nodes - 1)
        return base + (c.steps - crossing) * intra + crossing * inter
    if algorithm == "tree":
        return base + 2 * ((c.per_node - 1) * intra + log2i(c.nodes) * inter)
    return base + log2i(c.nodes) * inter / 3.5 + c.ranks * 2.8  # PAT


def tree_busbw(c: Collective) -> float:
    """The tree's bus bandwidth before tuning.cc's protocol factors: on more than two nodes
    the network's (``bwInter``, the ring's); on two, its intra-node chains' (``bwIntra``), at
    most twice the network's (the search raises it no further)."""
    if c.nodes > 2 or c.intra_busbw is None:
        return c.busbw
    return max(c.busbw, min(c.intra_busbw, 2 * c.busbw))


def bus_bandwidth(c: Collective, algorithm: str, protocol: str, message_bytes: float) -> float:
    """tuning.cc's bus bandwidth of one call (bytes/s), with the tree's size correction."""
    bw = c.busbw
    ll_max = LL_MAX_BUSBW[min(c.nodes, 3)] if c.nodes > 1 else math.inf
    if algorithm == "ring":
        return {"LL": min(ll_max, bw * 0.5), "LL128": bw * 0.92, "Simple": bw}[protocol]
    if algorithm == "pat":
        return bw * 0.75
    bw = 0.92 * tree_busbw(c)
    bw = {"LL": min(bw / 3.8, ll_max), "LL128": bw * 120 / 128, "Simple": bw}[protocol]
    log_size = log2i(int(message_bytes) >> 6)
    if message_bytes >= 64 and log_size < 23:
        bw *= TREE_CORRECTION[protocol][log_size]
    return bw


def call_time(c: Collective, algorithm: str, protocol: str, message_bytes: float) -> float:
    """Seconds of one call by ``algorithm`` and ``protocol``: latency plus the bytes over the
    algorithm bandwidth (tuning.cc converts bus to algorithm bandwidth by ranks/steps for a
    ring, by 1/2 for a tree, not at all for PAT). ``message_bytes`` is the full buffer (for
    reduce-scatter and all-gather, the unsharded size)."""
    latency = latency_us(c, algorithm, protocol)
    if (algorithm == "ring" and protocol == "Simple" and c.kind == "all_reduce" and c.nodes > 1
            and message_bytes / (MAX_CHANNELS * c.ranks) >= 64):
        latency *= RING_PLATEAU_FACTOR
    share = {"ring": c.steps / c.ranks, "tree": 2.0, "pat": 1.0}[algorithm]
    return latency * 1e-6 + share * message_bytes / bus_bandwidth(c, algorithm, protocol,
                                                                  message_bytes)


def tuned_time(c: Collective, message_bytes: float, algorithm: str = "auto") -> float:
    """What NCCL's tuner picks: the fastest (algorithm, protocol) it considers, or the fastest
    protocol of one ``algorithm``."""
    choices = algorithms(c) if algorithm == "auto" else (algorithm,)
    return min(call_time(c, a, p, message_bytes) for a in choices for p in protocols(c, a))
