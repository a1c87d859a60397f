"""Expert routing costs against independent numbers: the busiest EP rank's load against a
brute-force simulation of random top-k routing, grouped-GEMM tile padding and the
dispatcher's permutation bytes worked by hand."""

from __future__ import annotations

import random

import pytest

from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import Split, gemm_time
from autoplan.costmodels.experts import grouped_gemm_time, slowest_rank_load
from autoplan.costmodels.profiles import compute_profile
from autoplan.graph.layer_graph import Experts

MIXTRAL = Experts(name="experts", num_experts=8, top_k=2, params_per_expert=1,
                  tokens_per_expert=1.0, router="gate")


def _simulated_busiest_load(tokens_per_rank: int, ep: int, trials: int) -> float:
    """Mean over trials of (rows the busiest of ep GPUs receives) / (its balanced share):
    every token of the EP group draws top_k distinct experts uniformly."""
    rng = random.Random(17)
    local = MIXTRAL.num_experts // ep
    share = tokens_per_rank * MIXTRAL.top_k  # balanced rows per GPU
    total = 0.0
    for _ in range(trials):
        rows = [0] * ep
        for _ in range(tokens_per_rank * ep):
            for expert in rng.sample(range(MIXTRAL.num_experts), MIXTRAL.top_k):
                rows[expert // local] += 1
        total += max(rows) / share
    return total / trials


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_busiest_rank_load_matches_a_routing_simulation(ep):
    simulated = _simulated_busiest_load(tokens_per_rank=256, ep=ep, trials=60)
    modelled = slowest_rank_load(MIXTRAL, 256, ep)
    assert modelled > 1.0
    assert modelled - 1 == pytest.approx(simulated - 1, rel=0.25)


def test_no_imbalance_without_expert_parallelism():
    assert slowest_rank_load(MIXTRAL, 4096, 1) == 1.0


def test_grouped_gemm_pads_each_group_to_whole_tiles():
    """4 experts of 130 rows each: every group needs 2 row tiles of 128 (256 rows), so the
    grouped GEMM costs what one GEMM of 4 x 256 = 1024 rows costs in compute."""
    gpu = get_gpu("a100-sxm4-80gb")
    profile = compute_profile("a100-sxm4-80gb")
    peak = gpu.peak_flops("bf16")
    grouped = grouped_gemm_time(4, 130, 14336, 4096, gpu, peak, profile)
    assert grouped == pytest.approx(gemm_time(1024, 14336, 4096, gpu, peak, profile), rel=1e-12)
    assert grouped > gemm_time(4 * 130, 14336, 4096, gpu, peak, profile)


def test_grouped_gemm_of_few_rows_streams_every_experts_weight():
    """Decode-like: 8 experts of 1 row each are bound by reading 8 weights of 4096 x 14336
    bf16 (939.5 MB) at the A100's achieved 0.80 x 2039 GB/s: 0.576 ms."""
    gpu = get_gpu("a100-sxm4-80gb")
    profile = compute_profile("a100-sxm4-80gb")
    seconds = grouped_gemm_time(8, 1, 14336, 4096, gpu, gpu.peak_flops("bf16"), profile)
    weights = 8 * 4096 * 14336 * 2
    assert seconds == pytest.approx(weights / (0.80 * 2039e9), rel=0.01)
