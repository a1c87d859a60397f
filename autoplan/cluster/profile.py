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

Either table may be left out; a group whose links have no table uses the built-in model.
cluster.yaml names the file with ``nccl_profile: nccl-profile.yaml`` (relative to cluster.yaml)
or gives the same mapping inline; ``group_links(..., profile=...)`` takes one directly.

How a table is read (costmodels.comm): busbw is interpolated linearly in log(size) between
points; below the smallest size the *time* of the smallest is kept (latency-bound), above the
largest the busbw of the largest. ``inter_node`` was measured with every GPU of a node in one
communicator, so a group with k of a node's g GPUs gets k/g of it (the NICs are shared by the
node's concurrent groups, as in the built-in model). busbw is, by nccl-tests' definition, the
same for any ring size, so one table serves groups of every size, and reduce-scatter, all-gather
and all-to-all read the all-reduce table (nccl-tests reports their busbw on the same scale).
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
class NcclProfile:
    """Measured busbw curves; ``None`` where the profile has no table for that link class."""

    intra: BusbwCurve | None = None
    inter: BusbwCurve | None = None
    source: str = ""


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
        inter=_curve(data["inter_node"], f"{origin}.inter_node") if "inter_node" in data else None,
        source=str(data.get("source", "")),
    )


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
