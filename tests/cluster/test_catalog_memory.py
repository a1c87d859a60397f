"""A catalog GPU's memory is what the GPU offers programs: the framebuffer total nvidia-smi
prints, not the datasheet's round figure. Expected values are published nvidia-smi readings
(each named below), and "fits" is judged against them."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.cluster.catalog import get_gpu

TINY = "examples/models/tiny_gpt.py"

MIB = 2**20

NVIDIA_SMI_TOTAL_MIB = {
    "h100-sxm5-80gb": 81559,  # modal-labs/modal-client PR 2797; NVIDIA/nccl issue 1264
    "v100-sxm2-16gb": 16160,  # 4paradigm/k8s-vgpu-scheduler issue 7
    "a100-sxm4-40gb": 40960,  # modal-labs/modal-client PR 2797
    "l40s": 46068,            # modal-labs/modal-client PR 2797
    "rtx-4090": 24564,        # RLinf/RLinf issue 255
}


@pytest.mark.parametrize("name", sorted(NVIDIA_SMI_TOTAL_MIB))
def test_catalog_memory_is_the_nvidia_smi_total(name):
    assert get_gpu(name).memory_bytes == NVIDIA_SMI_TOTAL_MIB[name] * MIB


def test_estimate_judges_fits_against_what_the_gpu_offers():
    """An H100 80GB offers 81559 MiB = 79.65 GiB (not 80): the estimate's limit is that."""
    cluster = {"name": "one-h100", "gpu": "h100-sxm5-80gb", "nodes": 1, "gpus_per_node": 1,
               "intra_node": {"link": "nvswitch", "bandwidth": "450GB/s"}}
    estimate = autoplan.estimate(TINY, cluster, {"tp": 1, "pp": 1, "dp": 1, "mbs": 1},
                                 seq_len=64, global_batch=1).estimate
    assert estimate.memory_limit_gib == pytest.approx(81559 / 1024)
