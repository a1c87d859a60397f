"""The 8-GPU node the published H100/A100 runs used (NVSwitch inside, one NIC per GPU across),
as a cluster.yaml mapping: shared by the benchmarks that pose those runs."""

from __future__ import annotations


def eight_gpu_nodes(name: str, gpu, gpus: int, *, nvlink: str = "450GB/s",
                    nic: str = "400Gbps") -> dict:
    """``gpus`` GPUs of kind ``gpu`` (a catalog name or a GPU mapping) in nodes of 8 (one node of
    ``gpus`` below 8), NVSwitch at ``nvlink``, 8 InfiniBand NICs of ``nic`` a node."""
    return {"name": name, "gpu": gpu, "nodes": max(1, gpus // 8), "gpus_per_node": min(8, gpus),
            "intra_node": {"link": "nvswitch", "bandwidth": nvlink},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": nic,
                           "latency": "5us"}}
