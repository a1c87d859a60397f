"""Measured NCCL bus bandwidth by message size: a profile file that overrides the built-in curve.

A profile is what ``nccl-tests``' ``all_reduce_perf`` printed on the user's own machines, one
table per link class, message size -> bus bandwidth (the ``busbw`` column), both with units::

    # nccl-profile.yaml
    source: "all_reduce_perf -b 1M -e 8G -f 2 -g 1, 2x DGX A100, 2024-05-01"
    intra_node:          # one node, all of its GPUs in the communicator
      1MiB: 60GB/s
      16MiB: 150GB/s
      1GiB: 200GB/s
    inter_node:          # whole nodes over the network (2+ nodes, all GPUs of each)
      1MiB: 10GB/s
      1GiB: 90GB/s

Real fabrics lose bus bandwidth as rings grow (more hops, more switch levels, more contention),
so ``inter_node`` may instead give one table per node count the test ran on::

    inter_node:
      2:  {1MiB: 10GB/s, 1GiB: 90GB/s}
      64: {1MiB: 4GB/s, 1GiB: 70GB/s}

Either table may be left out; a group whose links have no table uses the built-in model.
cluster.yaml names the file with ``nccl_profile: nccl-profile.yaml`` (relative to cluster.yaml)
or gives the same mapping inline; ``group_links(..., profile=...)`` takes one directly.

How a table is read (costmodels.comm): busbw is interpolated linearly in log(size) between
points; below the smallest size the *time* of the smallest is kept (latency-bound), above the
largest the busbw of the largest. ``inter_node`` was measured with every GPU of a node in one
communicator, so a group with k of a node's g GPUs gets k/g of it (the NICs are shared by the
node's concurrent groups, as in the built-in model). A flat table serves groups over any number
of nodes; with tables by node count, a group spanning N nodes reads the busbw of the tables
either side of N interpolated linearly in log(N) (the nearest table outside the measured range).
Reduce-scatter, all-gather and all-to-all read the all-reduce table (nccl-tests reports their
busbw on the same scale).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from autoplan.errors import ClusterSpecError, UnitError
from autoplan.units import parse_quantity

_EXAMPLE = "intra_node: {1MiB: 60GB/s, 1GiB: 200GB/s}"


@dataclass(frozen=True, slots=True)
class BusbwCurve:
    """Measured (message bytes, busbw bytes/s) points, sorted by size."""

    sizes: tuple[float, ...]
    busbw: tuple[float, ...]

    def at(self, message_bytes: float) -> float:
        """Bus bandwidth (bytes/s) for a message of ``message_bytes``."""
        sizes, bws = self.sizes, self.busbw
        if message_bytes <= sizes[0]:
            return bws[0] * message_bytes / sizes[0]  # same time as the smallest measured
        if message_bytes >= sizes[-1]:
            return bws[-1]
        i = bisect.bisect_right(sizes, message_bytes)
        x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
        w = (math.log(message_bytes) - x0) / (x1 - x0)
        return bws[i - 1] + w * (bws[i] - bws[i - 1])


@dataclass(frozen=True, slots=True)
class NodeCurves:
    """Measured inter-node busbw curves by the number of nodes the test spanned (sorted)."""

    nodes: tuple[int, ...]
    curves: tuple[BusbwCurve, ...]

    def at(self, message_bytes: float, num_nodes: int) -> float:
        """busbw for a message over ``num_nodes`` nodes: log-linear between measured counts."""
        values = [c.at(message_bytes) for c in self.curves]
        if num_nodes <= self.nodes[0]:
            return values[0]
        if num_nodes >= self.nodes[-1]:
            return values[-1]
        i = bisect.bisect_right(self.nodes, num_nodes)
        x0, x1 = math.log(self.nodes[i - 1]), math.log(self.nodes[i])
        w = (math.log(num_nodes) - x0) / (x1 - x0)
        return values[i - 1] + w * (values[i] - values[i - 1])


@dataclass(frozen=True, slots=True)
class NcclProfile:
    """Measured busbw curves; ``None`` where the profile has no table for that link class.
    ``inter`` holds the inter-node tables by node count (one entry, node count 2, for the flat
    form: busbw then does not change with the number of nodes)."""

    intra: BusbwCurve | None = None
    inter: NodeCurves | None = None
    source: str = ""

    def inter_busbw(self, message_bytes: float, num_nodes: int) -> float | None:
        """Measured inter-node busbw of whole nodes, or None without an inter_node table."""
        return None if self.inter is None else self.inter.at(message_bytes, num_nodes)


def _curve(table: object, where: str) -> BusbwCurve:
    if not isinstance(table, dict) or not table:
        raise ClusterSpecError(
            f"{where}: expected a mapping of message size to busbw, e.g. {_EXAMPLE}; got {table!r}.")
    points = []
    for size, bw in table.items():
        try:
            points.append((parse_quantity(size, "memory", field=f"{where} size"),
                           parse_quantity(bw, "bandwidth", field=f"{where}.{size}")))
        except UnitError as err:
            raise ClusterSpecError(f"{err} A profile line looks like '1MiB: 60GB/s'.") from None
    points.sort()
    if any(s <= 0 or b <= 0 for s, b in points):
        raise ClusterSpecError(f"{where}: sizes and busbw must be positive, e.g. {_EXAMPLE}.")
    return BusbwCurve(tuple(s for s, _ in points), tuple(b for _, b in points))


def nccl_profile_from_mapping(data: object, origin: str = "nccl_profile") -> NcclProfile:
    """Validate a profile mapping (the file's content, or the inline cluster.yaml value)."""
    if not isinstance(data, dict):
        raise ClusterSpecError(
            f"{origin}: expected a mapping with intra_node and/or inter_node tables, e.g. "
            f"{_EXAMPLE}; got {type(data).__name__}.")
    unknown = sorted(set(data) - {"source", "intra_node", "inter_node"})
    if unknown:
        raise ClusterSpecError(
            f"{origin}: unknown key(s) {', '.join(map(repr, unknown))}; a profile has source, "
            "intra_node and inter_node.")
    if "intra_node" not in data and "inter_node" not in data:
        raise ClusterSpecError(f"{origin}: give intra_node or inter_node, e.g. {_EXAMPLE}.")
    return NcclProfile(
        intra=_curve(data["intra_node"], f"{origin}.intra_node") if "intra_node" in data else None,
        inter=_node_curves(data["inter_node"], f"{origin}.inter_node") if "inter_node" in data else None,
        source=str(data.get("source", "")),
    )


_NODES_EXAMPLE = "inter_node: {2: {1MiB: 10GB/s, 1GiB: 90GB/s}, 64: {1MiB: 4GB/s, 1GiB: 70GB/s}}"


def _node_count(key: object) -> int | None:
    """A node-count key (YAML gives an int, a JSON round trip a string of digits), or None."""
    if isinstance(key, bool):
        return None
    text = str(key)
    return int(text) if text.isdigit() and int(text) >= 2 else None


def _node_curves(table: object, where: str) -> NodeCurves:
    """The inter-node tables: keyed by node count (values are tables) or one flat table."""
    if not isinstance(table, dict) or not any(isinstance(v, dict) for v in table.values()):
        return NodeCurves((2,), (_curve(table, where),))
    points = []
    for key, curve in table.items():
        nodes = _node_count(key)
        if nodes is None or not isinstance(curve, dict):
            raise ClusterSpecError(
                f"{where}: keyed by node count, each key a whole number of nodes (2 or more) "
                f"and each value a table of message size to busbw, e.g. {_NODES_EXAMPLE}; "
                f"got {key!r}: {curve!r}.")
        points.append((nodes, _curve(curve, f"{where}.{nodes}")))
    points.sort(key=lambda p: p[0])
    return NodeCurves(tuple(n for n, _ in points), tuple(c for _, c in points))


def load_nccl_profile(source: str | Path | dict) -> NcclProfile:
    """Read a profile file (path) or an already-parsed mapping."""
    if isinstance(source, dict):
        return nccl_profile_from_mapping(source)
    path = Path(source)
    if not path.is_file():
        raise ClusterSpecError(
            f"nccl_profile: no such file {str(path)!r}; give the path of a YAML file of message "
            f"size -> busbw (relative to cluster.yaml), e.g. {_EXAMPLE}.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ClusterSpecError(f"{path}: not valid YAML ({err}).") from None
    return nccl_profile_from_mapping(data, str(path))
