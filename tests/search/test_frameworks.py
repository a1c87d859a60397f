"""--runtime auto: every runtime searched, the best kept, each runtime's capability table obeyed."""

import importlib
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autoplan
from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.capabilities import RUNTIME_TARGET
from autoplan.errors import AutoplanError, ExportError, InfeasibleError
from autoplan.search.brute import brute_force
from autoplan.search.space import candidate_plans
from autoplan.training import Pins, Runtime
from tests.search.test_solver import cluster, tiny_gpt

ORDER = list(Runtime)  # the stated tie-break between runtimes: megatron, deepspeed, fsdp

cases = st.fixed_dictionaries({
    "layers": st.sampled_from([2, 4]),
    "width": st.sampled_from([(64, 4), (128, 8)]),
    "nodes": st.sampled_from([1, 2]),
    "gpus": st.sampled_from([2, 4]),
    "ethernet": st.booleans(),
    "batch": st.sampled_from([8, 16]),
    "headroom_mib": st.sampled_from([4, 64, 4096]),
})


def _brute_per_runtime(model, spec, batch, limit):
    """The brute-force optimum of each runtime's own space (None: nothing fits)."""
    loaded = load_cluster(spec)
    found = {}
    for runtime in Runtime:
        problem = make_problem(model, loaded, training_spec(256, batch, "bf16", runtime.value, "flash"),
                               mem_limit=limit)
        found[runtime] = brute_force(problem, Pins())
    return found


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_auto_solve_equals_brute_force_over_runtimes(case):
    hidden, heads = case["width"]
    model = tiny_gpt(case["layers"], hidden, heads)
    spec = cluster(case["nodes"], case["gpus"], case["ethernet"])
    limit = 1.5 * 2**30 + case["headroom_mib"] * 2**20
    found = _brute_per_runtime(model, spec, case["batch"], limit)
    fitting = {r: v for r, v in found.items() if v is not None}
    if not fitting:
        with pytest.raises(InfeasibleError):
            autoplan.solve(model, spec, seq_len=256, global_batch=case["batch"], mem_limit=limit,
                           time_limit_s=60, runners_up=False)
        return
    # The order across runtimes, as within one: step time (whole µs), GPUs, tp*pp, memory,
    # then the runtime order.
    best = min(fitting, key=lambda r: (round(fitting[r][1].step_time_s * 1e6),
                                       fitting[r][0].world_size,
                                       fitting[r][0].tp * fitting[r][0].pp,
                                       fitting[r][1].peak_memory_gib, ORDER.index(r)))
    result = autoplan.solve(model, spec, seq_len=256, global_batch=case["batch"],
                            mem_limit=limit, time_limit_s=60, runners_up=False)
    assert result.training.runtime == best.value
    assert result.plan == fitting[best][0]
    listed = {o.runtime: o for o in result.runtimes}
    assert list(listed) == [r.value for r in Runtime]
    for runtime, reference in found.items():
        option = listed[runtime.value]
        if reference is None:
            assert option.plan is None and option.status == "INFEASIBLE" and option.reason
        else:
            assert option.plan == reference[0]
            assert round(option.step_time_s * 1e6) == round(reference[1].step_time_s * 1e6)


@pytest.mark.parametrize("runtime", list(Runtime))
def test_the_search_never_proposes_what_the_runtime_export_refuses(runtime):
    """Every candidate of a runtime's space passes its own export target's check()."""
    model = tiny_gpt(6, 128, 8)
    spec = cluster(2, 4, False)
    base = autoplan.estimate(model, spec, {}, seq_len=256, global_batch=16,
                             runtime=runtime.value)
    problem = make_problem(model, load_cluster(spec), training_spec(256, 16, "bf16", runtime.value,
                                                                "flash"))
    check = importlib.import_module(f"autoplan.plugins.{RUNTIME_TARGET[runtime]}").check
    plans = list(candidate_plans(problem.graph, world=8, gpus_per_node=4,
                                 training=problem.training, pins=Pins(), every_dp=True))
    assert len(plans) > 100
    refused = []
    for plan in plans:
        try:
            check(base.model_copy(update={"plan": plan}))
        except ExportError as err:
            refused.append((plan, str(err)))
    assert refused == []
    if runtime is Runtime.DEEPSPEED:  # the DeepSpeed pipeline engine has no interleaving
        assert all(p.vpp == 1 for p in plans) and all(p.zero_stage <= 1 for p in plans if p.pp > 1)


def test_a_pin_one_runtime_lacks_names_those_that_have_it():
    model = tiny_gpt(2, 64, 4)
    with pytest.raises(InfeasibleError) as err:
        autoplan.solve(model, cluster(1, 4, False), seq_len=256, global_batch=8,
                       pins={"zero": 3}, runtime="megatron", runners_up=False)
    assert err.value.exit_code == 3
    assert ("--zero 3 --runtime megatron: Megatron-LM runs ZeRO-3 as Megatron-FSDP's "
            "optim_grads_params, which autoplan does not price; DeepSpeed and FSDP do") \
        in str(err.value)


def test_zero3_alone_solves_on_deepspeed_or_fsdp():
    model = tiny_gpt(2, 64, 4)
    result = autoplan.solve(model, cluster(1, 4, False), seq_len=256, global_batch=8,
                            pins={"zero": 3}, runners_up=False)
    assert result.plan.zero_stage == 3
    assert result.training.runtime in ("deepspeed", "fsdp")
    statuses = {o.runtime: o.status for o in result.runtimes}
    assert statuses["megatron"] == "UNSUPPORTED"
    assert {statuses["deepspeed"], statuses["fsdp"]} <= {"OPTIMAL", "FEASIBLE"}


def test_pins_no_runtime_has_exit_3_naming_each_runtime():
    """Interleaving (vpp) exists on Megatron-LM and FSDP, parameter offload on DeepSpeed and
    FSDP, ZeRO-3 with a pipeline on FSDP only; with 8 GPUs of 4 nodes no runtime has all."""
    model = tiny_gpt(6, 64, 4)
    with pytest.raises(InfeasibleError) as err:
        autoplan.solve(model, cluster(1, 4, False), seq_len=256, global_batch=8,
                       pins={"vpp": 2, "offload": "optimizer"}, runners_up=False)
    text = str(err.value)
    assert "--vpp 2 --runtime deepspeed: DeepSpeed has no interleaved pipeline schedule; " \
           "Megatron-LM and FSDP do" in text
    assert "--offload optimizer --runtime fsdp: FSDP has no optimizer offload; Megatron-LM and " \
           "DeepSpeed do" in text


def test_an_auto_solve_evaluates_no_plan_twice_on_one_problem(monkeypatch):
    """The ZeRO-2/ZeRO-3 re-solves and the runners-up search the problems their runtime's
    search made, whose memo holds what it evaluated: a plan met again costs nothing."""
    from autoplan.costmodels import step

    evaluated, real = [], step._evaluate

    def counting(problem, plan):
        if sys._getframe(1).f_code.co_name == "_evaluated":  # the search's, not estimate()'s
            evaluated.append((id(problem), plan))
        return real(problem, plan)

    monkeypatch.setattr(step, "_evaluate", counting)
    result = autoplan.solve(tiny_gpt(4, 128, 8), cluster(2, 4, False), seq_len=256,
                            global_batch=16, processes=1)  # all in this process, to count
    assert result.zero_options, "the case should compare ZeRO-2 with ZeRO-3"
    assert len(evaluated) == len(set(evaluated)) > 0


def test_zero_options_are_the_plans_of_searches_with_the_stage_pinned():
    """The ZeRO-2/ZeRO-3 plans shown side by side are read from each runtime's own search
    (Table.best_at_zero); a separate search with the stage and the runtime pinned must find
    the same plan with the same estimate."""
    model, nodes = tiny_gpt(4, 128, 8), cluster(2, 4, False)
    result = autoplan.solve(model, nodes, seq_len=256, global_batch=16)
    assert result.zero_options, "the case should compare ZeRO-2 with ZeRO-3"
    for option in result.zero_options:
        pinned = autoplan.solve(model, nodes, seq_len=256, global_batch=16,
                                runtime=option.runtime, pins={"zero": option.zero_stage},
                                runners_up=False)
        assert (option.plan, option.step_time_s, option.peak_memory_gib) == (
            pinned.plan, pinned.estimate.step_time_s, pinned.estimate.peak_memory_gib)


def _answer(**kwargs) -> tuple:
    """A solve's JSON without its wall time, or its error's (type, exit code, message)."""
    try:
        document = autoplan.solve(**kwargs).model_dump(mode="json")
    except AutoplanError as err:
        return type(err).__name__, err.exit_code, str(err)
    document["solver"].pop("wall_time_s")
    return document


@pytest.mark.parametrize("case", [
    {"pins": {}},  # every runtime, ZeRO-2/ZeRO-3 side by side, runners-up
    {"pins": {"zero": 3}},  # Megatron-LM unsupported: two runtimes searched
    {"pins": {}, "mem_limit": 2**20},  # nothing fits anywhere: the explained refusal
])
def test_runtimes_searched_side_by_side_answer_as_one_after_another(case):
    """The runtimes searched in forked processes (processes=3: two children and this one)
    give the same JSON, runtimes list, ZeRO options and runners-up included, or the same
    error, as the three searched here one after another (processes=1)."""
    kwargs = dict(model=tiny_gpt(4, 128, 8), cluster=cluster(2, 4, False), seq_len=256,
                  global_batch=16, **case)
    serial, side_by_side = _answer(**kwargs, processes=1), _answer(**kwargs, processes=3)
    assert side_by_side == serial
    if isinstance(serial, dict) and not case["pins"]:
        assert serial["zero_options"] and serial["runners_up"]  # the case covers both
