"""Objectives, bounds, GPU budgets and batch alternatives: CP-SAT against brute force over the
same space; runners-up and conflict cores against enumeration."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.errors import InfeasibleError
from autoplan.search.brute import brute_force
from autoplan.search.objective import key as objective_key
from autoplan.search.solve import solve_search
from autoplan.search.table import RUNNERS_UP, Table
from autoplan.training import Bounds, Objective, Pins, Range
from tests.search.test_solver import cluster, tiny_gpt

OBJECTIVES = [("time",), ("gpus",), ("cost",), ("gpus", "time"), ("cost", "time"),
              ("time", "gpus")]

cases = st.fixed_dictionaries({
    "layers": st.sampled_from([2, 4]),
    "width": st.sampled_from([(64, 4), (128, 8)]),
    "nodes": st.sampled_from([1, 2]),
    "gpus": st.sampled_from([2, 4, 8]),
    "batches": st.sampled_from([(16,), (8, 32)]),
    "terms": st.sampled_from(OBJECTIVES),
    "throughput_of_best": st.sampled_from([None, 0.3, 0.8]),
    "max_gpus": st.sampled_from([None, 3, 4]),
    "bounds": st.sampled_from([None, Bounds(tp=Range(max=2)), Bounds(pp=Range(min=2)),
                               Bounds(dp=Range(min=2, max=4), mbs=Range(max=2))]),
    "headroom_mib": st.sampled_from([8, 4096]),
})


def _problems(case):
    hidden, heads = case["width"]
    model = tiny_gpt(case["layers"], hidden, heads)
    loaded = load_cluster(cluster(case["nodes"], case["gpus"], False))
    limit = 1.5 * 2**30 + 32 * 2**20 + case["headroom_mib"] * 2**20  # context + cuBLAS workspace
    return [make_problem(model, loaded, training_spec(256, b, "bf16", "megatron", "flash"),
                         mem_limit=limit) for b in case["batches"]]


def _throughput(problems, fraction):
    """A throughput target relative to the fastest plan's (so some targets exclude plans)."""
    if fraction is None:
        return None
    best = brute_force(problems, Pins())
    return None if best is None else fraction * best[1].tokens_per_s


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_objective_optimum_equals_brute_force(case):
    problems = _problems(case)
    objective = Objective(terms=case["terms"],
                          min_tokens_per_s=_throughput(problems, case["throughput_of_best"]))
    kwargs = dict(objective=objective, bounds=case["bounds"], max_gpus=case["max_gpus"])
    reference = brute_force(problems, Pins(), **kwargs)
    if reference is None:
        with pytest.raises(InfeasibleError):
            solve_search(problems, Pins(), time_limit_s=30, **kwargs)
        return
    solution = solve_search(problems, Pins(), time_limit_s=30, **kwargs)
    assert solution.info.status == "OPTIMAL"
    per_token = len(problems) > 1
    tokens = lambda p: 256 * p.global_batch_size  # noqa: E731
    ours = objective_key(objective, solution.estimate.step_time_s, solution.plan.world_size,
                         tokens(solution.plan), per_token=per_token)
    theirs = objective_key(objective, reference[1].step_time_s, reference[0].world_size,
                           tokens(reference[0]), per_token=per_token)
    assert ours == theirs
    plan = solution.plan
    assert case["max_gpus"] is None or plan.world_size <= case["max_gpus"]
    assert case["bounds"] is None or case["bounds"].admits(
        tp=plan.tp, pp=plan.pp, dp=plan.dp, mbs=plan.micro_batch_size, vpp=plan.vpp)
    if objective.min_tokens_per_s:
        assert solution.estimate.tokens_per_s >= objective.min_tokens_per_s * (1 - 1e-9)


def _one(gpus=8, batch=16, headroom_mib=4096, layers=4):
    model = tiny_gpt(layers, 128, 8)
    loaded = load_cluster(cluster(1, gpus, False))
    return make_problem(model, loaded, training_spec(256, batch, "bf16", "megatron", "flash"),
                        mem_limit=1.5 * 2**30 + (32 + headroom_mib) * 2**20)  # + cuBLAS workspace


def test_gpus_objective_takes_the_fewest_gpus_that_reach_the_throughput():
    problem = _one()
    fastest = brute_force(problem, Pins())[1]
    target = 0.5 * fastest.tokens_per_s
    solution = solve_search(problem, Pins(), time_limit_s=30,
                            objective=Objective(terms=("gpus", "time"), min_tokens_per_s=target))
    table = Table.build(problem, Pins(), objective=Objective(terms=("gpus",)), prune=False)
    reaching = [r for r in table.fitting() if table.estimate(r).tokens_per_s >= target]
    assert solution.plan.world_size == min(table.plans[r].world_size for r in reaching)
    assert solution.plan.world_size < 8
    assert solution.info.objective_unit == "GPUs"
    assert solution.info.objective == solution.plan.world_size


def test_cost_objective_reports_dollars_per_million_tokens():
    problem = _one()
    objective = Objective(terms=("cost",), price_per_gpu_hour=3.0)
    solution = solve_search(problem, Pins(), time_limit_s=30, objective=objective)
    est, plan = solution.estimate, solution.plan
    expected = plan.world_size * 3.0 / 3600 / est.tokens_per_s * 1e6
    assert solution.info.objective_unit == "$/Mtoken"
    assert solution.info.objective == pytest.approx(expected)


def test_runners_up_are_the_best_eligible_plan_per_shape_of_the_full_table():
    problem = _one(headroom_mib=32)
    solution = solve_search(problem, Pins(), time_limit_s=30)
    runners = solution.table.runners_up(solution.row, count=1000)
    full = Table.build(problem, Pins(), prune=False)
    expected = {}
    for r in full.eligible():
        shape = (full.plans[r].tp, full.plans[r].pp)
        expected[shape] = min(expected.get(shape, full.order(r)), full.order(r))
    mine = (solution.plan.tp, solution.plan.pp)
    assert {(u.tp, u.pp) for u in runners} == set(expected) - {mine}
    for u in runners:
        assert round(u.step_time_s * 1e6) == expected[(u.tp, u.pp)][0]
        assert u.slower_by >= 0
    # By default only the best few shapes, still exact and in order.
    top = solve_search(problem, Pins(), time_limit_s=30)
    best = sorted((k for shape, k in expected.items() if shape != mine))[:RUNNERS_UP]
    assert [round(u.step_time_s * 1e6) for u in top.table.runners_up(top.row)] == [k[0] for k in best]
    for count in (1, 2):  # shapes that cannot enter so short a list are completed only partly
        few = solve_search(problem, Pins(), time_limit_s=30)
        assert ([round(u.step_time_s * 1e6) for u in few.table.runners_up(few.row, count=count)]
                == [k[0] for k in best[:count]])
    assert [u.step_time_s for u in runners] == sorted(u.step_time_s for u in runners)


def _leanest_gib(problem, pins):
    table = Table.build(problem, pins, prune=False)
    return min(table.peak_bytes) / 2**30


def test_conflicting_pins_are_named_with_memory():
    """tp=1 and zero=0 together overflow a limit that each alone can meet."""
    probe = _one(layers=6)
    both = _leanest_gib(probe, Pins(tp=1, zero=0, recompute="none"))
    only_tp = _leanest_gib(probe, Pins(tp=1, recompute="none"))
    only_zero = _leanest_gib(probe, Pins(zero=0, recompute="none"))
    assert max(only_tp, only_zero) < both
    headroom = ((max(only_tp, only_zero) + both) / 2 - 1.5) * 1024 - 32  # _one adds cuBLAS
    problem = _one(layers=6, headroom_mib=headroom)
    with pytest.raises(InfeasibleError) as err:
        solve_search(problem, Pins(tp=1, zero=0, recompute="none"), time_limit_s=30)
    message = str(err.value)
    assert "--tp 1" in message and "--zero 0" in message and "GiB per GPU" in message
    assert "leanest such plan" in message and "without --" in message


def test_bound_and_budget_conflict_without_memory():
    problem = _one()
    with pytest.raises(InfeasibleError) as err:
        solve_search(problem, Pins(), time_limit_s=30, bounds=Bounds(dp=Range(min=8)),
                     max_gpus=4)
    message = str(err.value)
    assert "dp >= 8 (bounds)" in message and "max_gpus 4" in message
    assert "GiB per GPU" not in message.split(";")[0]
