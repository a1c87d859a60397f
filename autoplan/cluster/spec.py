"""The cluster.yaml schema (pydantic, unknown keys rejected, units required) and its loader.

A loaded spec resolves into a :class:`Cluster`: catalog entries looked up, units turned into SI.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoplan.cluster.catalog import GpuSpec, LinkSpec, get_gpu, get_link, get_preset
from autoplan.cluster.profile import NcclProfile, load_nccl_profile
from autoplan.errors import ClusterSpecError, ConstraintError, UnitError
from autoplan.units import parse_quantity


def _quantity(kind: str, most: float | None = None, why: str = ""):
    """A pydantic field validator that insists on a unit of ``kind`` (value kept as written)
    and, for ``most``, on a positive value no larger: beyond it no hardware exists, so the
    figure is a slip of the unit (``why`` says what the fastest hardware does)."""

    def check(value: object) -> object:
        if value is None:
            return value
        try:
            parsed = parse_quantity(value, kind)
        except UnitError as err:
            raise ValueError(str(err).split(": ", 1)[-1]) from None
        if most is not None and not 0 < parsed <= most:
            raise ValueError(f"{value} is not a plausible {kind}: {why}; check the number and "
                             "its unit (GB/s is bytes, Gbps bits)")
        return value

    return check


MAX_LINK_BANDWIDTH = 4e12
"""Per GPU per direction: NVLink 5 (B200) moves 0.9 TB/s, NVLink 6 (Rubin, announced 2025)
1.8 TB/s; twice that is no GPU link."""
MAX_NIC_BANDWIDTH = 400e9
"""Per NIC per direction: the fastest NICs shipping (ConnectX-8, 800 Gb/s) move 100 GB/s; four
times that (3.2 Tb/s) is no NIC."""
MAX_HBM_BANDWIDTH = 50e12
"""HBM3e on B200 gives 8 TB/s, HBM4 on Rubin (announced) about 22 TB/s; no GPU memory is twice
as fast."""
MAX_HOST_BANDWIDTH = 1e12
"""GPU<->host per direction: PCIe 6 x16 is 128 GB/s, Grace Hopper's NVLink-C2C 450 GB/s."""
_LINK_WHY = "the fastest GPU link (NVLink 6) moves 1.8 TB/s per GPU per direction"
_NIC_WHY = "the fastest NIC (800 Gb/s) moves 100 GB/s per direction"
_HBM_WHY = "the fastest GPU memory (HBM4) moves about 22 TB/s"
_HOST_WHY = "the fastest GPU-host link (NVLink-C2C) moves 450 GB/s per direction"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuEntry(_Strict):
    """An inline GPU that is not in the catalog."""

    name: str
    memory: str
    bf16: str | None = None
    fp16: str | None = None
    fp8: str | None = None
    memory_bandwidth: str

    _memory = field_validator("memory", mode="before")(_quantity("memory"))
    _flops = field_validator("bf16", "fp16", "fp8", mode="before")(_quantity("flops"))
    _bandwidth = field_validator("memory_bandwidth", mode="before")(
        _quantity("bandwidth", MAX_HBM_BANDWIDTH, _HBM_WHY))

    @model_validator(mode="after")
    def _has_peak(self) -> "GpuEntry":
        if self.bf16 is None and self.fp16 is None:
            raise ValueError("give the GPU's dense peak, e.g. bf16: 312TFLOPS")
        return self


class IntraNode(_Strict):
    """Links between the GPUs of one node; bandwidth per GPU per direction."""

    link: Literal["nvswitch", "nvlink", "pcie"]
    bandwidth: str | None = None
    latency: str | None = None

    _bandwidth = field_validator("bandwidth", mode="before")(
        _quantity("bandwidth", MAX_LINK_BANDWIDTH, _LINK_WHY))
    _latency = field_validator("latency", mode="before")(_quantity("time"))


class InterNode(_Strict):
    """The network between nodes; bandwidth per NIC per direction."""

    link: Literal["infiniband", "roce", "ethernet", "efa"]
    nics_per_node: int = Field(default=1, ge=1)
    bandwidth: str
    latency: str | None = None
    interface: str | None = None
    nccl_net_latency: str | None = None
    kept_per_doubling: float | None = Field(default=None, gt=0, le=1)
    """The share of its busbw a ring keeps per doubling of the nodes it spans (catalog link's
    ``kept_per_doubling`` otherwise)."""

    _bandwidth = field_validator("bandwidth", mode="before")(
        _quantity("bandwidth", MAX_NIC_BANDWIDTH, _NIC_WHY))
    _latency = field_validator("latency", "nccl_net_latency", mode="before")(_quantity("time"))


class Host(_Strict):
    name: str
    ip: str

    @field_validator("ip")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address; write e.g. 10.0.0.1") from None
        return value


_RATIO_EXAMPLE = 'oversubscription: "2:1"'


def _ratio(value: object) -> float:
    """``"2:1"`` (or a plain number, a ratio has no unit) -> 2.0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ratio = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*:\s*([0-9]*\.?[0-9]+)\s*", str(value))
        if match is None or float(match[2]) == 0:
            raise ValueError(f"{value!r} is not a ratio; write downlink:uplink, e.g. {_RATIO_EXAMPLE}")
        ratio = float(match[1]) / float(match[2])
    if ratio < 1:
        raise ValueError(f"{value!r} gives leaves more uplink than downlink; a non-blocking fabric "
                         'is "1:1", a 2x oversubscribed one "2:1"')
    return ratio


class FabricSpec(_Strict):
    """How the nodes' NICs are switched. A group spanning several leaves crosses the leaf
    uplinks, which carry ``1/oversubscription`` of the leaf's downlink bandwidth."""

    kind: Literal["fat-tree", "rail-optimized", "single-switch"] = "fat-tree"
    oversubscription: str | float = "1:1"
    nodes_per_leaf: int | None = Field(default=None, ge=1)

    _oversub = field_validator("oversubscription")(lambda v: (_ratio(v), v)[1])

    @model_validator(mode="after")
    def _leaves_known(self) -> "FabricSpec":
        if self.kind != "single-switch" and _ratio(self.oversubscription) > 1 \
                and self.nodes_per_leaf is None:
            raise ValueError("an oversubscribed fabric needs nodes_per_leaf (how many nodes one "
                             "leaf switch serves), e.g. nodes_per_leaf: 32")
        return self


def _apply_preset(data: object) -> object:
    """Fill a node description from its ``preset``; stated keys win (intra_node and inter_node
    are merged key by key, so ``inter_node: {interface: ib0}`` keeps the preset's NICs)."""
    if not isinstance(data, dict) or data.get("preset") is None:
        return data
    try:
        merged = get_preset(data["preset"])
    except ClusterSpecError as err:
        raise ValueError(str(err).removeprefix("preset: ")) from None
    for key, value in data.items():
        base = merged.get(key)
        merged[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    return merged


class _NodeKeys(_Strict):
    """The keys that describe a kind of node; shared by the cluster and its groups."""

    preset: str | None = None
    gpu: str | GpuEntry | None = None
    nodes: int | None = Field(default=None, ge=1)
    gpus_per_node: int | None = Field(default=None, ge=1)
    intra_node: IntraNode | None = None
    inter_node: InterNode | None = None
    hosts: list[Host] | None = None
    cpu_memory: str | None = None
    host_bandwidth: str | None = None

    _memory = field_validator("cpu_memory", mode="before")(_quantity("memory"))
    _host = field_validator("host_bandwidth", mode="before")(
        _quantity("bandwidth", MAX_HOST_BANDWIDTH, _HOST_WHY))

    _preset = model_validator(mode="before")(_apply_preset)

    def _missing(self, prefix: str) -> list[str]:
        examples = {"gpu": "gpu: a100-sxm4-80gb", "nodes": "nodes: 4", "gpus_per_node": "gpus_per_node: 8",
                    "intra_node": "intra_node: {link: nvswitch, bandwidth: 300GB/s}"}
        if self.gpus_per_node == 1:  # a GPU alone in its node has no intra-node link
            del examples["intra_node"]
        return [f"{prefix}{key}: missing; add e.g. {example} (or preset: dgx-a100)"
                for key, example in examples.items() if getattr(self, key) is None]

    def _check_hosts(self, prefix: str) -> None:
        if self.hosts is not None and len(self.hosts) != self.nodes:
            raise ValueError(f"{prefix}hosts lists {len(self.hosts)} hosts but {prefix}nodes is "
                             f"{self.nodes}; give one host per node")


def _check_unique_hosts(hosts: list[Host]) -> None:
    """Every node needs its own name and address: a repeated one would start two nodes' ranks
    on one machine (the hostfile and the launch scripts address nodes by them)."""
    for what in ("name", "ip"):
        values = [getattr(h, what) for h in hosts]
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"hosts: {', '.join(repeated)} appear{'s' if len(repeated) == 1 else ''} "
                             f"more than once as a host {what}; give every node its own {what}")


class NodeGroupSpec(_NodeKeys):
    """One kind of node in a heterogeneous cluster (e.g. 8 DGX A100 + 4 DGX-1 V100)."""

    name: str


class ClusterSpec(_NodeKeys):
    """What cluster.yaml says, validated: one kind of node, or ``groups`` of several kinds."""

    name: str | None = None
    groups: list[NodeGroupSpec] | None = Field(default=None, min_length=1)
    fabric: FabricSpec | None = None
    nccl_profile: str | dict | None = None

    @field_validator("nccl_profile")
    @classmethod
    def _profile_parses(cls, value: str | dict | None) -> str | dict | None:
        if value is not None:
            try:
                load_nccl_profile(value)
            except ClusterSpecError as err:
                raise ValueError(str(err)) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterSpec":
        if self.groups is None:
            self._single()
        else:
            self._grouped()
        return self

    def _single(self) -> None:
        missing = self._missing("")
        if missing:
            raise ValueError("; ".join(missing))
        if self.nodes > 1 and self.inter_node is None:
            raise ValueError(
                f"nodes is {self.nodes} but inter_node is missing; add e.g. "
                "inter_node: {link: infiniband, nics_per_node: 8, bandwidth: 200Gbps}"
            )
        self._check_hosts("")
        _check_unique_hosts(self.hosts or [])

    def _grouped(self) -> None:
        stated = [k for k in ("preset", "gpu", "nodes", "gpus_per_node", "intra_node", "inter_node",
                              "hosts", "cpu_memory", "host_bandwidth") if getattr(self, k) is not None]
        if stated:
            raise ValueError(f"with groups, describe the nodes inside each group; move "
                             f"{', '.join(stated)} into the groups")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must differ; got {names}")
        total = sum(g.nodes or 0 for g in self.groups)
        for i, group in enumerate(self.groups):
            prefix = f"groups.{i}.({group.name})."
            missing = group._missing(prefix)
            if missing:
                raise ValueError("; ".join(missing))
            if total > 1 and group.inter_node is None:
                raise ValueError(f"{prefix}inter_node is missing but the cluster has {total} "
                                 "nodes; add e.g. inter_node: {link: infiniband, nics_per_node: 8, "
                                 "bandwidth: 200Gbps}")
            group._check_hosts(prefix)
        _check_unique_hosts([h for g in self.groups for h in g.hosts or ()])


@dataclass(frozen=True, slots=True)
class Fabric:
    """The resolved switch fabric. ``nodes_per_leaf`` covers all nodes when there is one leaf."""

    kind: str = "single-switch"
    oversubscription: float = 1.0
    nodes_per_leaf: int = 1

    def leaf_of(self, node: int) -> int:
        return node // self.nodes_per_leaf


@dataclass(frozen=True, slots=True)
class Cluster:
    """A resolved cluster: SI units, catalog entries looked up.

    A heterogeneous cluster lists its kinds of node in ``groups`` (each a homogeneous
    ``Cluster``); its own node fields are then those of the first group, except ``num_nodes``,
    ``num_gpus`` and ``hosts``, which cover the whole cluster. solve and estimate plan across
    different groups (stages on groups, ``costmodels.groups``); the commands that assume one
    kind of node call :func:`require_homogeneous` first.
    """

    name: str
    gpu: GpuSpec
    num_nodes: int
    gpus_per_node: int
    intra: LinkSpec
    inter: LinkSpec | None
    nics_per_node: int
    interface: str | None
    hosts: tuple[tuple[str, str], ...]
    cpu_memory_bytes: float | None = None
    """Host memory per node (for offload); None when cluster.yaml does not say."""
    host_bandwidth_Bps: float | None = None
    """GPU<->host (PCIe) bandwidth per GPU per direction; None when cluster.yaml does not say."""
    fabric: Fabric = Fabric()
    groups: tuple["Cluster", ...] = ()
    nccl_profile: NcclProfile | None = None

    @property
    def num_gpus(self) -> int:
        if self.groups:
            return sum(g.num_gpus for g in self.groups)
        return self.num_nodes * self.gpus_per_node

    @property
    def is_homogeneous(self) -> bool:
        """True when every node has the same GPU, links, host memory and host bandwidth."""
        return len({_node_kind(g) for g in self.groups}) <= 1


def _node_kind(cluster: Cluster) -> tuple:
    return (cluster.gpu, cluster.gpus_per_node, cluster.intra, cluster.inter, cluster.nics_per_node,
            cluster.cpu_memory_bytes, cluster.host_bandwidth_Bps)


def require_homogeneous(cluster: Cluster, command: str = "this command") -> None:
    """Refuse a cluster whose groups differ, for a ``command`` that assumes one kind of node.

    Raises:
        ConstraintError: the groups differ; the message names them and what does handle them.
    """
    if cluster.is_homogeneous:
        return
    kinds = ", ".join(f"{g.name} ({g.num_nodes}x{g.gpus_per_node} {g.gpu.name})" for g in cluster.groups)
    raise ConstraintError(
        f"cluster {cluster.name!r} mixes kinds of node ({kinds}); {command} assumes one kind of "
        "node (autoplan solve and estimate plan across groups). Give one group's nodes as a "
        "cluster of their own (its gpu, nodes, gpus_per_node, intra_node, inter_node).")


def _resolve_gpu(gpu: str | GpuEntry) -> GpuSpec:
    if isinstance(gpu, str):
        return get_gpu(gpu)
    flops = {k: parse_quantity(v, "flops") if v else None for k, v in
             (("bf16", gpu.bf16), ("fp16", gpu.fp16), ("fp8", gpu.fp8))}
    return GpuSpec(
        name=gpu.name, memory_bytes=parse_quantity(gpu.memory, "memory"),
        bf16_flops=flops["bf16"], fp16_flops=flops["fp16"] or flops["bf16"], fp8_flops=flops["fp8"],
        memory_bandwidth_Bps=parse_quantity(gpu.memory_bandwidth, "bandwidth"), nvlink=None,
        source="cluster.yaml",
    )


def _with_overrides(base: LinkSpec, bandwidth: str | None, latency: str | None,
                    nccl_net_latency: str | None = None) -> LinkSpec:
    return replace(
        base,
        bandwidth_Bps=parse_quantity(bandwidth, "bandwidth") if bandwidth else base.bandwidth_Bps,
        latency_s=parse_quantity(latency, "time") if latency else base.latency_s,
        nccl_net_latency_s=(parse_quantity(nccl_net_latency, "time") if nccl_net_latency
                            else base.nccl_net_latency_s),
    )


LONE_GPU_LINK = IntraNode(link="pcie")
"""The intra-node link of a node with one GPU, which states none: its PCIe to the host is its
only link; no collective crosses it (every group of two or more GPUs spans nodes)."""


def _resolve_intra(intra: IntraNode, gpu: GpuSpec) -> LinkSpec:
    if intra.link == "pcie":
        rate = parse_quantity(intra.bandwidth, "bandwidth") if intra.bandwidth else 32e9
        base = get_link("pcie5" if rate >= 50e9 else "pcie4" if rate >= 24e9 else "pcie3")
    elif gpu.nvlink is not None:
        base = get_link(gpu.nvlink)
    elif intra.bandwidth is None:
        raise ClusterSpecError(
            f"intra_node.bandwidth: the GPU {gpu.name!r} has no NVLink in the catalog; state the "
            "link's bandwidth per GPU per direction, e.g. bandwidth: 300GB/s"
        )
    else:
        base = get_link("nvlink3")
    return _with_overrides(base, intra.bandwidth, intra.latency)


EFA_V2_INTERFACES = 8
"""EFA interfaces per node from which a node is of the second EFA generation or later (trn1:
8 x 100 Gb/s, p5: 32 x 100 Gb/s, p5en: 16 x 200 Gb/s), whose nccl-tests busbw falls far less
with the node count than the first's (p3dn: 1 x 100 Gb/s, p4d: 4 x 100 Gb/s; catalog
``efa`` and ``efa-v2``). The count, not the bandwidth: a cluster.yaml that states the
bandwidth its interfaces reach, lower than their rate, stays of its generation."""


def _resolve_inter(inter: InterNode) -> LinkSpec:
    rate = parse_quantity(inter.bandwidth, "bandwidth")
    name = {
        "infiniband": ("infiniband-ndr" if rate >= 50e9 else
                       "infiniband-hdr" if rate >= 25e9 else "infiniband-edr"),
        "roce": "roce-400g" if rate >= 50e9 else "roce",
        "ethernet": ("ethernet-100g" if rate >= 12.5e9 else
                     "ethernet-25g" if rate >= 3.125e9 else "ethernet-10g"),
        "efa": "efa-v2" if inter.nics_per_node >= EFA_V2_INTERFACES else "efa",
    }[inter.link]
    link = _with_overrides(get_link(name), inter.bandwidth, inter.latency, inter.nccl_net_latency)
    if inter.kept_per_doubling is None:
        return link
    return replace(link, kept_per_doubling=inter.kept_per_doubling)


def _resolve_fabric(fabric: FabricSpec | None, num_nodes: int) -> Fabric:
    if fabric is None:
        return Fabric(nodes_per_leaf=num_nodes)
    per_leaf = num_nodes if fabric.kind == "single-switch" else min(fabric.nodes_per_leaf or num_nodes, num_nodes)
    oversub = 1.0 if fabric.kind == "single-switch" else _ratio(fabric.oversubscription)
    return Fabric(kind=fabric.kind, oversubscription=oversub, nodes_per_leaf=per_leaf)


def _optional(value: str | None, kind: str) -> float | None:
    return parse_quantity(value, kind) if value else None


def _resolve_node(keys: _NodeKeys, name: str, fabric: Fabric,
                  profile: NcclProfile | None) -> Cluster:
    gpu = _resolve_gpu(keys.gpu)
    inter = keys.inter_node
    return Cluster(
        name=name, gpu=gpu, num_nodes=keys.nodes, gpus_per_node=keys.gpus_per_node,
        intra=_resolve_intra(keys.intra_node or LONE_GPU_LINK, gpu),
        inter=_resolve_inter(inter) if inter else None,
        nics_per_node=inter.nics_per_node if inter else 0,
        interface=inter.interface if inter else None,
        hosts=tuple((h.name, h.ip) for h in keys.hosts or ()),
        cpu_memory_bytes=_optional(keys.cpu_memory, "memory"),
        host_bandwidth_Bps=_optional(keys.host_bandwidth, "bandwidth"),
        fabric=fabric, nccl_profile=profile,
    )


def resolve(spec: ClusterSpec) -> Cluster:
    """Turn a validated spec into a :class:`Cluster` with SI units."""
    profile = load_nccl_profile(spec.nccl_profile) if spec.nccl_profile is not None else None
    if spec.groups is None:
        fabric = _resolve_fabric(spec.fabric, spec.nodes)
        name = spec.name or f"{spec.nodes}x{spec.gpus_per_node} {_resolve_gpu(spec.gpu).name}"
        return _resolve_node(spec, name, fabric, profile)
    total = sum(g.nodes for g in spec.groups)
    fabric = _resolve_fabric(spec.fabric, total)
    groups = tuple(_resolve_node(g, g.name, fabric, profile) for g in spec.groups)
    first = groups[0]
    return replace(
        first, name=spec.name or " + ".join(f"{g.num_nodes}x{g.gpus_per_node} {g.gpu.name}" for g in groups),
        num_nodes=total, hosts=tuple(h for g in groups for h in g.hosts), groups=groups)


def _known_keys() -> list[str]:
    models = (ClusterSpec, NodeGroupSpec, GpuEntry, IntraNode, InterNode, Host, FabricSpec)
    return sorted({key for model in models for key in model.model_fields})


def _explain(err: ValidationError, origin: str) -> str:
    problems = []
    for item in err.errors():
        loc = [str(p) for p in item["loc"] if not str(p).startswith("function-")]
        message = item["msg"].removeprefix("Value error, ").rstrip(".")
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1], _known_keys(), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "check its spelling against the cluster.yaml format"
            message = f"unknown key ({hint})"
        if not loc:  # a check across fields: its message names them
            problems.append(message)
            continue
        got = repr(item.get("input"))
        problems.append(f"{'.'.join(loc)}: {message} (got {got if len(got) < 80 else got[:77] + '...'})")
    return f"{origin}: invalid cluster description. " + "; ".join(problems) + "."


def load_cluster_spec(source: str | Path | dict) -> ClusterSpec:
    """Read and validate cluster.yaml (a path) or an already-parsed mapping."""
    origin = "cluster" if isinstance(source, dict) else str(source)
    data = source
    if not isinstance(source, dict):
        path = Path(source)
        if not path.is_file():
            raise ClusterSpecError(f"{origin}: no such file; pass the path of a cluster.yaml.")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise ClusterSpecError(f"{origin}: not valid YAML ({err}).") from None
    if not isinstance(data, dict):
        raise ClusterSpecError(
            f"{origin}: expected a mapping with keys gpu, nodes, gpus_per_node, intra_node, "
            f"inter_node; got {type(data).__name__}."
        )
    profile = data.get("nccl_profile")
    if isinstance(profile, str) and not isinstance(source, dict) and not Path(profile).is_absolute():
        data = {**data, "nccl_profile": str(Path(source).parent / profile)}
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise ClusterSpecError(_explain(err, origin)) from None
