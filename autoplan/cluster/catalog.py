"""The hardware catalog: GPUs and links by name, read from catalog.yaml (figures with sources)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from functools import cache

from autoplan.errors import ClusterSpecError
from autoplan.packaged import read_yaml
from autoplan.units import parse_quantity


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model. Peaks are dense tensor-core FLOP/s; None where the GPU lacks the format."""

    name: str
    memory_bytes: float
    bf16_flops: float | None
    fp16_flops: float
    fp8_flops: float | None
    memory_bandwidth_Bps: float
    nvlink: str | None
    source: str = ""
    sm_count: int | None = None  # None: unknown, GEMMs are then costed without wave quantization
    compute_capability: float | None = None  # None: unknown, priced without NVLS buffers

    def peak_flops(self, precision: str) -> float:
        """Dense 16-bit peak for a precision; bf16 falls back to fp16 on GPUs without bf16
        (V100). Under FP8 training (bf16 with Transformer Engine's FP8 GEMMs) it is the bf16
        peak, which attention, the LM head and the MFU basis run at (``fp8_flops``: the FP8
        GEMMs')."""
        if precision in ("bf16", "fp8"):
            return self.bf16_flops or self.fp16_flops
        return self.fp16_flops


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A link type. ``bandwidth_Bps`` is per GPU (intra-node) or per NIC (inter-node), per
    direction; ``allreduce_efficiency`` is the fraction of it that nccl-tests reaches [Empirical]
    (for a network link: over two nodes). ``kept_per_doubling``: for a network link, the share
    of its busbw a ring keeps each time the nodes it spans double beyond two [Empirical]; 1.0
    where no loss is measured."""

    name: str
    kind: str
    bandwidth_Bps: float
    latency_s: float
    allreduce_efficiency: float
    source: str = ""
    nccl_net_latency_s: float = 0.0  # what the network plugin reports to NCCL's tuner
    kept_per_doubling: float = 1.0

    def efficiency_at(self, nodes: int) -> float:
        """``allreduce_efficiency`` of a ring over ``nodes`` nodes: times ``kept_per_doubling``
        for every doubling of the span beyond two nodes (:func:`kept_share`)."""
        return self.allreduce_efficiency * kept_share(self.kept_per_doubling, nodes)


def kept_share(kept_per_doubling: float, nodes: int) -> float:
    """The share of its two-node busbw a ring over ``nodes`` nodes keeps: ``kept_per_doubling
    ** log2(nodes / 2)``, 1 on one or two nodes.

    Why a loss per doubling: each doubling of a ring's span puts its traffic through more of
    the fabric (more leaves, so more of its hops through the spine, and more flows hashed or
    sprayed onto each spine link) and makes the ring wait on the slowest of twice the links;
    what one doubling costs is the fabric's, read from nccl-tests at several node counts
    (catalog ``efa-v2``: 0.965, from the p5 all_reduce_perf plateau over 4 to 32 nodes;
    ``efa``: 0.837, from p3dn's on 2 and 8 nodes)."""
    if nodes <= 2:
        return 1.0
    return kept_per_doubling ** math.log2(nodes / 2)


@cache
def _catalog() -> dict:
    return read_yaml("autoplan.cluster", "catalog.yaml")


def _gpu_from_entry(name: str, entry: dict) -> GpuSpec:
    def flops(key: str) -> float | None:
        value = entry.get(key)
        return None if value is None else parse_quantity(value, "flops", field=f"gpus.{name}.{key}")

    return GpuSpec(
        name=name,
        memory_bytes=parse_quantity(entry["memory"], "memory", field=f"gpus.{name}.memory"),
        bf16_flops=flops("bf16"),
        fp16_flops=flops("fp16") or flops("bf16"),
        fp8_flops=flops("fp8"),
        memory_bandwidth_Bps=parse_quantity(entry["memory_bandwidth"], "bandwidth"),
        nvlink=entry.get("nvlink"),
        source=entry.get("source", ""),
        sm_count=entry.get("sm_count"),
        compute_capability=(float(entry["compute_capability"])
                            if entry.get("compute_capability") is not None else None),
    )


def gpu_names() -> list[str]:
    return sorted(_catalog()["gpus"])


def link_names() -> list[str]:
    return sorted(_catalog()["links"])


def _did_you_mean(name: str, choices: list[str]) -> str:
    """Names that contain what was typed (``a100`` -> the A100 variants), else the closest."""
    key = name.lower()
    close = [c for c in choices if key and key in c][:3] or difflib.get_close_matches(
        key, choices, n=1, cutoff=0.4)
    return f" Did you mean {' or '.join(map(repr, close))}?" if close else ""


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU by catalog name (case-insensitive)."""
    key = name.strip().lower()
    entries = _catalog()["gpus"]
    if key not in entries:
        raise ClusterSpecError(
            f"gpu: unknown GPU {name!r}.{_did_you_mean(key, gpu_names())} Known GPUs: "
            f"{', '.join(gpu_names())}; or give a mapping such as "
            "{name: my-gpu, memory: 80GiB, bf16: 312TFLOPS, memory_bandwidth: 2039GB/s}."
        )
    return _gpu_from_entry(key, entries[key])


def get_link(name: str) -> LinkSpec:
    """Look up a link type by catalog name (e.g. ``nvlink3``, ``infiniband-hdr``, ``pcie4``)."""
    entries = _catalog()["links"]
    if name not in entries:
        raise ClusterSpecError(
            f"unknown link {name!r}.{_did_you_mean(name, link_names())} Known links: "
            f"{', '.join(link_names())}."
        )
    entry = entries[name]
    return LinkSpec(
        name=name,
        kind=entry["kind"],
        bandwidth_Bps=parse_quantity(entry["bandwidth"], "bandwidth", field=f"links.{name}"),
        latency_s=parse_quantity(entry["latency"], "time", field=f"links.{name}.latency"),
        allreduce_efficiency=float(entry["allreduce_efficiency"]),
        source=entry.get("source", ""),
        nccl_net_latency_s=parse_quantity(entry.get("nccl_net_latency", "0us"), "time",
                                          field=f"links.{name}.nccl_net_latency"),
        kept_per_doubling=float(entry.get("kept_per_doubling", 1.0)),
    )


def preset_names() -> list[str]:
    return sorted(_catalog()["presets"])


def get_preset(name: str) -> dict:
    """The cluster.yaml keys of a standard node (``dgx-a100``, ``dgx-h100``...), without its
    ``source``; a fresh copy the caller may change."""
    key = str(name).strip().lower()
    entries = _catalog()["presets"]
    if key not in entries:
        raise ClusterSpecError(
            f"preset: unknown preset {name!r}.{_did_you_mean(key, preset_names())} Known presets: "
            f"{', '.join(preset_names())}; e.g. preset: dgx-a100."
        )
    entry = {k: (dict(v) if isinstance(v, dict) else v) for k, v in entries[key].items()}
    entry.pop("source", None)
    return entry
