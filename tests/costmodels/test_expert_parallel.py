"""Expert parallelism in the cost model, against hand-worked figures: the experts a GPU holds
(counted from the real torch model) and the bytes each all-to-all moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.extras import require

transformers = require("transformers")

import autoplan  # noqa: E402
from autoplan.cluster.topology import group_links  # noqa: E402
from autoplan.costmodels import comm  # noqa: E402
from autoplan.costmodels.compute import Split  # noqa: E402
from autoplan.costmodels.experts import routed_bytes  # noqa: E402
from autoplan.units import GIB  # noqa: E402

ROOT = Path(__file__).parents[2]
MODEL = ROOT / "examples/models/hf_mixtral_tiny.py"
CLUSTER = ROOT / "examples/clusters/dgx-a100-x1.yaml"
SEQ = 256


def _torch_counts() -> tuple[int, int]:
    """(all parameters, expert parameters) of the real CPU model."""
    from examples.models.hf_mixtral_tiny import build_model
    model = build_model()
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total, experts


def _estimate(**pins):
    return autoplan.estimate(MODEL, CLUSTER, {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, **pins},
                             seq_len=SEQ, global_batch=8)


def test_ep2_holds_half_the_experts_and_shards_their_states_over_the_expert_dp_group():
    total, experts = _torch_counts()
    assert experts > total / 2  # the experts are most of a Mixtral
    one, two = _estimate(ep=1).estimate, _estimate(ep=2).estimate
    weights = lambda e: e.memory_breakdown_gib["weights"] * GIB  # noqa: E731
    # bf16 weights: 2 bytes per parameter held; ep=2 holds all dense and half the expert ones.
    assert weights(one) == pytest.approx(2 * total, rel=1e-12)
    assert weights(two) == pytest.approx(2 * (total - experts / 2), rel=1e-12)
    # ZeRO-0: Megatron's fp32 master + two moments (12 B) per held parameter, halved likewise.
    optimizer = lambda e: e.memory_breakdown_gib["optimizer"] * GIB  # noqa: E731
    assert optimizer(two) == pytest.approx(12 * (total - experts / 2), rel=1e-12)
    # ZeRO-1: dense states over dp=8, the held half of the experts over dp/ep=4: 12 N / 8 either way.
    z1 = _estimate(ep=2, zero=1).estimate
    assert optimizer(z1) == pytest.approx(12 * total / 8, rel=1e-12)


def test_routed_bytes_per_all_to_all_by_hand():
    graph = autoplan.load_model(MODEL).trace(SEQ)
    block = next(l for l in graph.layers if l.experts)
    # 256 tokens x top-2 copies x hidden 128 x 2 bytes, micro-batch 2, split over tp=2 (SP).
    assert routed_bytes(block, Split(tp=2, cp=1, sp=True, mbs=2)) == 256 * 2 * 128 * 2 * 2 / 2
    assert routed_bytes(block, Split(tp=1, cp=2, sp=False, mbs=1)) == 256 * 2 * 128 * 2 / 2


@pytest.mark.parametrize("recompute, per_layer", [("none", 4), ("full", 6)])
def test_ep_comm_is_the_all_to_alls_of_every_moe_layer(recompute, per_layer):
    # tp=2, dp=4, ep=4: the EP group is 4 ranks 2 apart (EP innermost of DP) in one node; each
    # of the 4 MoE blocks does dispatch + combine forward, their gradients backward (and the
    # forward's two again when fully recomputed), on 256*2*128*2/2 bytes per micro-batch.
    result = _estimate(tp=2, dp=4, ep=4, sp=True, recompute=recompute)
    cluster = autoplan.load_cluster(CLUSTER).cluster
    one = comm.all_to_all_time(256 * 2 * 128 * 2 / 2, group_links(cluster, 4, 2))
    m = result.plan.num_microbatches
    assert result.estimate.time_breakdown_s["ep_comm"] == pytest.approx(m * 4 * per_layer * one)


def test_plan_json_leaves_ep_out_at_one_and_keeps_it_above():
    assert "ep" not in _estimate().plan.model_dump(mode="json")
    assert _estimate(ep=4).plan.model_dump(mode="json")["ep"] == 4
