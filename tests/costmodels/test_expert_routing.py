"""Expert routing costs against independent numbers: the busiest EP rank's load against a
brute-force simulation of random top-k routing, grouped-GEMM tile padding and the
dispatcher's permutation bytes worked by hand."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from autoplan.api import load_model
from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import Split, gemm_time
from autoplan.costmodels.experts import grouped_gemm_time, routing_time, slowest_rank_load
from autoplan.costmodels.profiles import compute_profile
from autoplan.graph.layer_graph import Experts
from tests.extras import require

ROOT = Path(__file__).parents[2]

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


def test_routing_time_of_the_tiny_mixtral_by_hand():
    """Tiny Mixtral block (hidden 128, experts 128 -> 2x256 -> 128, 8 experts, top-2), seq 256,
    mbs 1, no TP/EP: 512 routed rows, 64 per expert, each padded to one 128-row tile (1024
    rows), so each expert Linear costs a 1024-row GEMM instead of the 512-row one counted, in
    forward, input- and weight-gradient. The dispatcher reads and writes the 512 routed rows
    of 128 bf16 values (131,072 B each way) in permute, unpermute and the two chunk sorts,
    forward and again backward."""
    transformers = require("transformers")  # noqa: F841 - the example model needs it
    graph = load_model(ROOT / "examples/models/hf_mixtral_tiny.py").trace(256)
    block = next(layer for layer in graph.layers if layer.experts)
    gpu, profile = get_gpu("a100-sxm4-80gb"), compute_profile("a100-sxm4-80gb")
    peak = gpu.peak_flops("bf16")
    surcharge = sum(gemm_time(1024, n, k, gpu, peak, profile) - gemm_time(512, n, k, gpu, peak, profile)
                    for n, k in ((512, 128), (128, 256)))  # gate_up, down
    passes = 4 * 2 * 512 * 128 * 2 / (0.80 * 2039e9)
    expected = 3 * surcharge + 2 * passes
    split = Split(tp=1, cp=1, sp=False, mbs=1)
    seconds = routing_time(block, split, 1, gpu=gpu, peak=peak, profile=profile,
                           full_recompute=False)
    assert seconds == pytest.approx(expected, rel=1e-9)
