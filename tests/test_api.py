"""The public API end to end: contracts, determinism, and a published setup."""

import json

import pytest

import autoplan
from autoplan.errors import ConstraintError, InfeasibleError

TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def test_solve_returns_the_json_contract():
    result = autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16)
    document = result.model_dump(mode="json")
    assert set(document["plan"]) >= {
        "tp", "pp", "dp", "cp", "zero_stage", "micro_batch_size", "global_batch_size",
        "num_microbatches", "recompute", "sequence_parallel", "vpp", "offload", "world_size",
        "stages"}
    assert set(document["estimate"]) >= {
        "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
        "peak_memory_gib", "memory_breakdown_gib", "time_breakdown_s", "feasible"}
    assert set(document["solver"]) >= {"status", "objective", "bound", "wall_time_s"}
    assert result.status == "OPTIMAL"
    plan = result.plan
    assert plan.tp * plan.pp * plan.dp * plan.cp == plan.world_size == 8
    assert plan.micro_batch_size * plan.num_microbatches * plan.dp == 16


def test_json_round_trips_exactly():
    result = autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16)
    text = result.model_dump_json()
    assert autoplan.Result.model_validate_json(text) == result


def test_same_input_gives_the_same_plan():
    first = autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16).model_dump(mode="json")
    second = autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16).model_dump(mode="json")
    for document in (first, second):
        document["solver"].pop("wall_time_s")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_estimate_fills_unpinned_dimensions_with_documented_defaults():
    result = autoplan.estimate(TINY, DGX1, {"tp": 2}, seq_len=256, global_batch=16)
    plan = result.plan
    assert (plan.tp, plan.pp, plan.dp, plan.micro_batch_size, plan.zero_stage) == (2, 1, 4, 1, 0)
    assert result.status == "ESTIMATE"


def test_pins_that_need_more_gpus_than_the_cluster_has_are_rejected():
    with pytest.raises(ConstraintError, match="GPU"):
        autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16, pins={"tp": 4, "pp": 4, "dp": 4})


def test_a_cluster_size_that_does_not_factor_uses_fewer_gpus():
    # 3 GPUs and a batch of 16: no data-parallel degree of 3 divides the batch, so the best
    # plan uses 2 GPUs (or a pipeline over 3, as the cost model decides), never 3 x DP.
    three = {"gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 3,
             "intra_node": {"link": "pcie", "bandwidth": "32GB/s"}}
    plan = autoplan.solve(TINY, three, seq_len=256, global_batch=16).plan
    assert plan.world_size <= 3 and 16 % plan.dp == 0


def test_infeasible_memory_says_by_how_much():
    with pytest.raises(InfeasibleError, match=r"GiB over"):
        autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16, mem_limit="1GiB")


def test_mtnlg_530b_beats_the_published_configuration():
    # Smith et al. 2022 / README sec. 2.1: TP=8 inside DGX A100 nodes, PP=35, DP=8 on 280 nodes.
    model = autoplan.load_model("examples/models/mtnlg_530b.py")
    cluster = "examples/clusters/dgx-a100-x280.yaml"
    result = autoplan.solve(model, cluster, seq_len=2048, global_batch=1920)
    published = autoplan.estimate(model, cluster, {"tp": 8, "pp": 35, "dp": 8, "mbs": 1,
                                                   "recompute": "full"},
                                  seq_len=2048, global_batch=1920)
    assert result.status == "OPTIMAL"
    assert result.plan.tp <= 8  # TP inside a node
    assert result.plan.pp >= 4  # a pipeline across nodes
    assert result.estimate.feasible
    assert result.estimate.step_time_s <= published.estimate.step_time_s


def test_a_short_time_limit_reports_feasible_with_an_honest_bound():
    model = autoplan.load_model("examples/models/gpt3_175b.py")
    cluster = "examples/clusters/dgx-a100-x128.yaml"
    full = autoplan.solve(model, cluster, seq_len=2048, global_batch=1536)
    for limit in (0.6, 1.0):
        try:
            quick = autoplan.solve(model, cluster, seq_len=2048, global_batch=1536,
                                   time_limit_s=limit)
        except autoplan.errors.NoPlanInTimeError:
            continue  # a slow machine found nothing yet: exit code 4, also honest
        if quick.status == "OPTIMAL":
            assert quick.estimate.step_time_s == pytest.approx(full.estimate.step_time_s)
        else:
            assert quick.status == "FEASIBLE"
            assert quick.solver.bound <= full.estimate.step_time_s <= quick.solver.objective


def test_a_plan_for_another_model_is_refused():
    result = autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16)
    with pytest.raises(ConstraintError, match="another model"):
        autoplan.estimate("examples/models/llama2_7b.py", DGX1, result.plan, seq_len=256,
                          global_batch=16)


def test_non_contiguous_stages_are_not_a_plan():
    with pytest.raises(ValueError, match="contiguous"):
        autoplan.Plan(tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=2,
                      num_microbatches=2, world_size=2,
                      stages=[{"first_layer": 0, "num_layers": 3}, {"first_layer": 4, "num_layers": 3}])
