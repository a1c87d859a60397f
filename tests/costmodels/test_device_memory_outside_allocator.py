"""Device memory outside PyTorch's caching allocator: the NVLink SHARP buffers NCCL maps per
communicator on Hopper NVSwitch nodes. Expected values are hand counts from NCCL 2.27's
src/transport/nvls.cc (``nvlsPerRankSize = nChannels * 2 * buffSize``, ``nvlsTotalSize =
nvlsPerRankSize * nHeads``, ``buffSize = NCCL_NVLS_CHUNKSIZE (128 KiB) * NCCL_STEPS (8)``)."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.costmodels.memory import nvls_buffer_bytes
from autoplan.units import GIB
from tests.graph.models import llama_gqa

MIB = 2**20
CONTEXT = 1.5 * GIB  # profiles.yaml cuda_context_bytes, every runtime


def test_an_eight_gpu_hopper_communicator_maps_256_mib():
    """16 channels (NVLS_NCHANNELS_SM90) x 2 halves x 1 MiB (128 KiB x 8 steps) x 8 heads."""
    assert nvls_buffer_bytes(8, compute_capability=9.0, nvswitch=True) == 16 * 2 * 1 * 8 * MIB


def test_blackwell_runs_32_nvls_channels():
    """NVLS_NCHANNELS_SM100 = 32: twice Hopper's 256 MiB for eight GPUs."""
    assert nvls_buffer_bytes(8, compute_capability=10.0, nvswitch=True) == 512 * MIB


@pytest.mark.parametrize("members, cc, nvswitch", [
    (2, 9.0, True),    # ncclNvlsInit: gpuCount <= 2 leaves NVLS off
    (8, 8.0, True),    # A100: search.cc skips NVLS below sm_90
    (8, 9.0, False),   # no NVSwitch on the node (H100 PCIe)
    (8, None, True),   # a GPU of unknown capability is priced without
])
def test_no_nvls_buffers_where_nccl_sets_none_up(members, cc, nvswitch):
    assert nvls_buffer_bytes(members, compute_capability=cc, nvswitch=nvswitch) == 0.0


def _outside(examples, pins, cluster):
    e = autoplan.estimate(llama_gqa, examples / "clusters" / cluster, pins, seq_len=64,
                          global_batch=32, runtime="megatron").estimate
    return (e.peak_memory_gib - e.peak_reserved_gib) * GIB


def test_the_estimate_prices_nvls_per_collective_group_outside_the_reserved_peak(examples):
    """On DGX H100s (8 GPUs per node, NVSwitch): DP 8 is one 8-GPU NVLS communicator (256 MiB
    beside the CUDA context), and so is DP 32 over four nodes (8 heads on each); TP 2 x DP 4 a
    TP group of two (none) and a DP group of four on the node (128 MiB); on a DGX A100 the
    same DP 8 has none."""
    h100 = "dgx-h100-x4.yaml"
    assert _outside(examples, {"dp": 8}, h100) == pytest.approx(CONTEXT + 256 * MIB)
    assert _outside(examples, {"dp": 32}, h100) == pytest.approx(CONTEXT + 256 * MIB)
    assert _outside(examples, {"tp": 2, "dp": 4}, h100) == pytest.approx(CONTEXT + 128 * MIB)
    assert _outside(examples, {"dp": 8}, "dgx-a100-x1.yaml") == pytest.approx(CONTEXT)
