"""Rank placement as a searched dimension: Megatron-LM's two rank orders, checked against
megatron-core's own rank generator, priced by the topology, and chosen when it is faster."""

import pytest

import autoplan
from autoplan.costmodels.placement import axis_stride
from autoplan.plan import Plan
from autoplan.plugins.megatron import megatron_args
from autoplan.search.space import balanced_stages
from tests.extras import require

parallel_state = require("megatron.core.parallel_state")

TINY = "examples/models/tiny_gpt.py"
SLOW_INTER = {"gpu": "a100-sxm4-80gb", "nodes": 2, "gpus_per_node": 8,
              "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
              "inter_node": {"link": "ethernet", "bandwidth": "10Gbps"}}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def _plan(placement: str, tp=2, pp=2, dp=4, microbatches=8) -> Plan:
    return Plan(tp=tp, pp=pp, dp=dp, micro_batch_size=1, global_batch_size=microbatches * dp,
                num_microbatches=microbatches, world_size=tp * pp * dp, placement=placement,
                stages=balanced_stages(autoplan.load_model(TINY).trace(256), pp))


@pytest.mark.parametrize("placement,order", [("tp-cp-dp-pp", "tp-cp-ep-dp-pp"),
                                             ("tp-cp-pp-dp", "tp-cp-ep-pp-dp")])
@pytest.mark.parametrize("axis", ["tp", "dp", "pp"])
def test_group_strides_are_megatrons(placement, order, axis):
    """Megatron's RankGenerator for the order it uses (default, or --use-tp-pp-dp-mapping)
    spaces each group's ranks by the stride the cost model prices."""
    plan = _plan(placement)
    ranks = parallel_state.RankGenerator(tp=plan.tp, ep=1, dp=plan.dp, pp=plan.pp, cp=1,
                                         order=order).get_ranks(axis)
    strides = {b - a for group in ranks for a, b in zip(group, group[1:])}
    assert strides == {axis_stride(plan, axis)}


def test_pipeline_inside_nodes_trades_pp_sends_for_dp_traffic():
    """On 2 nodes joined by 10 GbE, TP2 x PP2 x DP4: with tp-cp-dp-pp the PP pairs straddle
    the nodes; with tp-cp-pp-dp they share a node and the DP groups straddle instead."""
    outer = autoplan.estimate(TINY, SLOW_INTER, _plan("tp-cp-dp-pp"), seq_len=256, global_batch=32)
    inner = autoplan.estimate(TINY, SLOW_INTER, _plan("tp-cp-pp-dp"), seq_len=256, global_batch=32)
    assert inner.estimate.time_breakdown_s["pp_comm"] < outer.estimate.time_breakdown_s["pp_comm"]
    assert inner.estimate.time_breakdown_s["dp_comm"] > outer.estimate.time_breakdown_s["dp_comm"]


@pytest.mark.parametrize("batch,winner", [(32, "tp-cp-dp-pp"), (512, "tp-cp-pp-dp")])
def test_solver_picks_the_faster_order_and_megatron_gets_the_flag(batch, winner):
    """8 micro-batches per replica send less than the gradients weigh; 128 send more, and
    then pipeline neighbours belong on one node (the solver's choice is the faster estimate)."""
    pins = {"tp": 2, "pp": 2, "dp": 4, "mbs": 1}
    times = {p: autoplan.estimate(TINY, SLOW_INTER, {**pins, "placement": p}, seq_len=256,
                                  global_batch=batch).estimate.step_time_s
             for p in ("tp-cp-dp-pp", "tp-cp-pp-dp")}
    assert min(times, key=times.get) == winner
    solved = autoplan.solve(TINY, SLOW_INTER, seq_len=256, global_batch=batch,
                            pins={**pins, "zero": 0, "recompute": "none", "sp": False})
    assert solved.plan.placement == winner
    assert ("--use-tp-pp-dp-mapping" in megatron_args(solved)) == (winner == "tp-cp-pp-dp")


def test_runtimes_without_the_order_refuse_it():
    with pytest.raises(autoplan.errors.InfeasibleError,
                       match="--placement tp-cp-pp-dp --runtime deepspeed: DeepSpeed has no "
                             "rank order tp-cp-pp-dp; Megatron-LM does"):
        autoplan.estimate(TINY, SLOW_INTER, {"tp": 2, "pp": 2, "placement": "tp-cp-pp-dp"},
                          seq_len=256, global_batch=32, runtime="deepspeed")
