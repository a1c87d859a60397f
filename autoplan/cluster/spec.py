"""The cluster.yaml schema (pydantic, unknown keys rejected, units required) and its loader.

A loaded spec resolves into a :class:`Cluster`: catalog entries looked up, units turned into SI.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoplan.cluster.catalog import GpuSpec, LinkSpec, get_gpu, get_link
from autoplan.errors import ClusterSpecError, UnitError
from autoplan.units import parse_quantity


def _quantity(kind: str):
    """A pydantic field validator that insists on a unit of ``kind`` (value kept as written)."""

    def check(value: object) -> object:
        if value is None:
            return value
        try:
            parse_quantity(value, kind)
        except UnitError as err:
            raise ValueError(str(err).split(": ", 1)[-1]) from None
        return value

    return check


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

    _memory = field_validator("memory")(_quantity("memory"))
    _flops = field_validator("bf16", "fp16", "fp8")(_quantity("flops"))
    _bandwidth = field_validator("memory_bandwidth")(_quantity("bandwidth"))

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

    _bandwidth = field_validator("bandwidth")(_quantity("bandwidth"))
    _latency = field_validator("latency")(_quantity("time"))


class InterNode(_Strict):
    """The network between nodes; bandwidth per NIC per direction."""

    link: Literal["infiniband", "roce", "ethernet"]
    nics_per_node: int = Field(default=1, ge=1)
    bandwidth: str
    latency: str | None = None
    interface: str | None = None

    _bandwidth = field_validator("bandwidth")(_quantity("bandwidth"))
    _latency = field_validator("latency")(_quantity("time"))


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


class ClusterSpec(_Strict):
    """What cluster.yaml says, validated."""

    name: str | None = None
    gpu: str | GpuEntry
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    intra_node: IntraNode
    inter_node: InterNode | None = None
    hosts: list[Host] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterSpec":
        if self.nodes > 1 and self.inter_node is None:
            raise ValueError(
                f"nodes is {self.nodes} but inter_node is missing; add e.g. "
                "inter_node: {link: infiniband, nics_per_node: 8, bandwidth: 200Gbps}"
            )
        if self.hosts is not None and len(self.hosts) != self.nodes:
            raise ValueError(f"hosts lists {len(self.hosts)} hosts but nodes is {self.nodes}; "
                             "give one host per node")
        return self


@dataclass(frozen=True, slots=True)
class Cluster:
    """A resolved cluster: SI units, catalog entries looked up."""

    name: str
    gpu: GpuSpec
    num_nodes: int
    gpus_per_node: int
    intra: LinkSpec
    inter: LinkSpec | None
    nics_per_node: int
    interface: str | None
    hosts: tuple[tuple[str, str], ...]

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def has_infiniband(self) -> bool:
        return self.inter is not None and self.inter.kind == "infiniband"


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


def _with_overrides(base: LinkSpec, bandwidth: str | None, latency: str | None) -> LinkSpec:
    return LinkSpec(
        name=base.name, kind=base.kind,
        bandwidth_Bps=parse_quantity(bandwidth, "bandwidth") if bandwidth else base.bandwidth_Bps,
        latency_s=parse_quantity(latency, "time") if latency else base.latency_s,
        allreduce_efficiency=base.allreduce_efficiency, source=base.source,
    )


def _resolve_intra(intra: IntraNode, gpu: GpuSpec) -> LinkSpec:
    if intra.link == "pcie":
        base = get_link("pcie4")
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


def _resolve_inter(inter: InterNode) -> LinkSpec:
    rate = parse_quantity(inter.bandwidth, "bandwidth")
    name = {
        "infiniband": "infiniband-ndr" if rate >= 50e9 else "infiniband-hdr",
        "roce": "roce",
        "ethernet": "ethernet-100g" if rate >= 12.5e9 else "ethernet-10g",
    }[inter.link]
    return _with_overrides(get_link(name), inter.bandwidth, inter.latency)


def resolve(spec: ClusterSpec) -> Cluster:
    """Turn a validated spec into a :class:`Cluster` with SI units."""
    gpu = _resolve_gpu(spec.gpu)
    inter = spec.inter_node
    return Cluster(
        name=spec.name or f"{spec.nodes}x{spec.gpus_per_node} {gpu.name}",
        gpu=gpu, num_nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
        intra=_resolve_intra(spec.intra_node, gpu),
        inter=_resolve_inter(inter) if inter else None,
        nics_per_node=inter.nics_per_node if inter else 0,
        interface=inter.interface if inter else None,
        hosts=tuple((h.name, h.ip) for h in spec.hosts or ()),
    )


def _explain(err: ValidationError, origin: str) -> str:
    problems = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"] if not str(p).startswith("function-")) or "file"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check its spelling against the cluster.yaml format)"
        problems.append(f"{where}: {message} (got {item.get('input')!r})")
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
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise ClusterSpecError(_explain(err, origin)) from None
