"""Expert parallelism in the search: CP-SAT against brute force on MoE instances (ep among the
searched degrees), and a solve where splitting the experts is what makes the model fit."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.errors import InfeasibleError
from autoplan.search.brute import brute_force
from autoplan.search.solve import solve_table
from autoplan.search.space import check_pins
from autoplan.training import Pins
from tests.search.moe_models import tiny_moe
from tests.search.test_solver import cluster

moe_instances = st.fixed_dictionaries({
    "layers": st.sampled_from([2, 4]),
    "experts": st.sampled_from([2, 4, 8]),
    "nodes": st.sampled_from([1, 2]),
    "gpus": st.sampled_from([2, 4, 8]),
    "batch": st.sampled_from([8, 16]),
    "headroom_mib": st.sampled_from([4, 16, 64, 4096]),
    "runtime": st.sampled_from(["megatron", "fsdp", "deepspeed"]),
    "ep": st.sampled_from([None, 2]),  # searched, or pinned (tiny experts rarely need EP)
})


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(moe_instances)
def test_cp_sat_optimum_equals_brute_force_with_expert_parallelism(case):
    model = tiny_moe(case["layers"], 64, case["experts"])
    loaded = load_cluster(cluster(case["nodes"], case["gpus"], False))
    training = training_spec(256, case["batch"], "bf16", case["runtime"], "flash")
    limit = 1.5 * 2**30 + case["headroom_mib"] * 2**20
    problem = make_problem(model, loaded, training, mem_limit=limit)
    pins = Pins(ep=case["ep"])
    if case["ep"] and case["runtime"] == "deepspeed":
        with pytest.raises(InfeasibleError, match="DeepSpeed has no expert parallelism; "
                                                  "Megatron-LM and FSDP do"):
            check_pins(problem.graph, world=problem.cluster.num_gpus, training=training, pins=pins)
        return
    reference = brute_force(problem, pins)
    if reference is None:
        with pytest.raises(InfeasibleError):
            solve_table(problem, pins, time_limit_s=30)
        return
    plan, estimate, info = solve_table(problem, pins, time_limit_s=30)
    assert info.status == "OPTIMAL"
    assert round(estimate.step_time_s * 1e6) == round(reference[1].step_time_s * 1e6)
    assert plan == reference[0]


def _wide_moe_problem(mem_limit_gib: float):
    """4 blocks of 16 experts of 3 x 1024 x 4096 (0.8 B expert parameters) on 8 A100 40GB."""
    model = tiny_moe(4, 1024, 16, ffn=4096)
    loaded = load_cluster(cluster(1, 8, False))
    training = training_spec(1024, 8, "bf16", "megatron", "flash")
    return make_problem(model, loaded, training, mem_limit=mem_limit_gib * 2**30)


@pytest.mark.parametrize("mem_limit_gib", [4, 12, 40])
def test_cp_sat_equals_brute_force_on_a_model_whose_experts_dominate(mem_limit_gib):
    problem = _wide_moe_problem(mem_limit_gib)
    reference = brute_force(problem, Pins())
    plan, estimate, _ = solve_table(problem, Pins(), time_limit_s=30)
    assert plan == reference[0]
    assert round(estimate.step_time_s * 1e6) == round(reference[1].step_time_s * 1e6)


def test_expert_parallelism_wins_when_the_experts_do_not_fit():
    # Pinned to pure data parallelism with ZeRO-0, every GPU holding all experts needs
    # 0.8 B x 18 B (bf16 weight, fp32 grad, Adam) = 14.5 GB of expert states alone; 8 GiB
    # only fits when EP splits them (ep=8: one 2-expert share per GPU).
    problem = _wide_moe_problem(8)
    pins = Pins(tp=1, pp=1, zero=0)
    with pytest.raises(InfeasibleError):
        solve_table(problem, pins.model_copy(update={"ep": 1}), time_limit_s=30)
    plan, estimate, _ = solve_table(problem, pins, time_limit_s=30)
    assert plan.ep > 1 and estimate.feasible
    assert brute_force(problem, pins)[0] == plan
