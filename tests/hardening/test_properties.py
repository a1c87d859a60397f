"""Property tests (hypothesis): any cluster file or constraint gets an answer, never a
traceback; plans returned satisfy their own constraints; the cost model is monotone where
physics says it must be."""

import types

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import autoplan
from autoplan.api import load_cluster
from autoplan.problems import make_problem, training_spec
from autoplan.cli import app
from autoplan.costmodels.memory import model_state_bytes
from autoplan.costmodels.profiles import runtime_profile
from autoplan.costmodels.step import estimate
from autoplan.plan import Offload
from autoplan.search.solve import solve_table
from autoplan.training import Pins
from autoplan.zoo import GPT, GPTConfig, next_token_loss
from autoplan.search.defaults import plan_from_pins

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _tiny_module():
    module = types.ModuleType("tiny_props")
    config = GPTConfig(num_layers=4, hidden_size=128, num_heads=4, vocab_size=512, max_seq_len=128)
    module.build_model = lambda: GPT(config)
    module.loss = next_token_loss
    return module


TINY = autoplan.load_model(_tiny_module())

units = st.sampled_from(["", "GB/s", "Gbps", "GiB", "us", "banana"])
values = st.one_of(st.integers(-4, 64), st.floats(-1, 1e3, allow_nan=False),
                   st.text(max_size=6), st.none())
cluster_docs = st.fixed_dictionaries(
    {"gpu": st.sampled_from(["a100-sxm4-80gb", "h100-sxm5-80gb", "a100", "nope", 7]),
     "nodes": st.one_of(st.integers(-1, 4), st.text(max_size=3)),
     "gpus_per_node": st.integers(-1, 8)},
    optional={"intra_node": st.fixed_dictionaries(
                  {"link": st.sampled_from(["nvswitch", "pcie", "ethernet"])},
                  optional={"bandwidth": st.builds(lambda n, u: f"{n}{u}", st.integers(1, 900), units)}),
              "inter_node": st.fixed_dictionaries(
                  {"link": st.sampled_from(["infiniband", "ethernet"]),
                   "bandwidth": st.builds(lambda n, u: f"{n}{u}", st.integers(1, 900), units)},
                  optional={"nics_per_node": st.integers(-1, 8)}),
              "hosts": st.lists(st.fixed_dictionaries({"name": st.text(max_size=4),
                                                       "ip": st.sampled_from(["10.0.0.1", "x"])}),
                                max_size=3),
              "typo_key": values})


@SETTINGS
@given(doc=cluster_docs, batch=st.integers(1, 64), mem=st.sampled_from(["1GiB", "80GiB", "80"]))
def test_any_cluster_file_gets_an_answer_not_a_traceback(tmp_path_factory, doc, batch, mem):
    path = tmp_path_factory.mktemp("c") / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["solve", "examples/models/tiny_gpt.py", str(path),
                                      "--seq-len", "64", "--global-batch", str(batch),
                                      "--mem-limit", mem, "--time-limit", "20"])
    assert result.exit_code in (0, 2, 3, 4), result.output
    assert "Traceback" not in result.output
    if result.exit_code:
        assert result.stderr.strip()


group_docs = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"]),
     "gpu": st.sampled_from(["a100-sxm4-80gb", "v100-sxm2-32gb", "h100-sxm5-80gb", "nope"]),
     "nodes": st.sampled_from([-1, 1, 1, 1, 2]),
     "gpus_per_node": st.sampled_from([0, 1, 2, 2, 4]), "intra_node": st.just({"link": "nvswitch"})},
    optional={"inter_node": st.fixed_dictionaries(
        {"link": st.sampled_from(["infiniband", "ethernet"]),
         "bandwidth": st.sampled_from(["100Gbps", "10Gbps", "10"])})}),
    min_size=1, max_size=3, unique_by=lambda g: g["name"])


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(groups=group_docs, batch=st.sampled_from([4, 8, 16]), mem=st.sampled_from(["2GiB", "80GiB"]))
def test_any_heterogeneous_cluster_gets_an_answer_and_plans_fit_their_groups(
        tmp_path_factory, groups, batch, mem):
    path = tmp_path_factory.mktemp("g") / "cluster.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = CliRunner().invoke(app, ["solve", "examples/models/tiny_gpt.py", str(path),
                                      "--seq-len", "64", "--global-batch", str(batch),
                                      "--mem-limit", mem, "--time-limit", "20", "--json"])
    assert result.exit_code in (0, 2, 3, 4), result.output
    assert "Traceback" not in result.output
    if result.exit_code:
        assert result.stderr.strip() and not result.stdout
        return
    document = yaml.safe_load(result.stdout)  # JSON is YAML
    plan, est = document["plan"], document["estimate"]
    per_stage = plan["tp"] * plan["dp"] * plan["cp"]
    sizes = {g["name"]: g["nodes"] * g["gpus_per_node"] for g in groups}
    names = [stage.get("group") for stage in plan["stages"]]
    for name in set(names) - {None}:
        assert names.count(name) * per_stage <= sizes[name]
    limits = est.get("stage_memory_limit_gib") or [est["memory_limit_gib"]] * len(names)
    assert all(used <= limit for used, limit in zip(est["stage_memory_gib"], limits))


def _problem(gpus=8, inter="200Gbps", mem=None, batch=16):
    cluster = {"gpu": "a100-sxm4-80gb", "nodes": 2, "gpus_per_node": gpus // 2,
               "intra_node": {"link": "pcie", "bandwidth": "32GB/s"},
               "inter_node": {"link": "infiniband", "bandwidth": inter, "nics_per_node": 1}}
    return make_problem(TINY, load_cluster(cluster), training_spec(128, batch, "bf16", "megatron", "flash"),
                        mem_limit=mem)


PLAN_FIELD = {"tp": "tp", "pp": "pp", "zero": "zero_stage", "recompute": "recompute",
              "mbs": "micro_batch_size"}
pins = st.fixed_dictionaries({}, optional={
    "tp": st.sampled_from([1, 2, 4]), "pp": st.sampled_from([1, 2, 4]),
    "zero": st.sampled_from([0, 1]), "recompute": st.sampled_from(["none", "full"]),
    "mbs": st.sampled_from([1, 2])})


MIN_CHECKED = 10
"""Of the 25 generated examples at least this many must reach the property's assertions (not
be turned away with an AutoplanError), or the property holds vacuously."""


def test_returned_plans_satisfy_their_constraints():
    checked = []

    @SETTINGS
    @given(pinned=pins, mem_mib=st.integers(1536, 4096))
    def check(pinned, mem_mib):
        problem = _problem(mem=mem_mib * 2**20)
        try:
            plan, est, _ = solve_table(problem, Pins(**pinned), time_limit_s=20)
        except autoplan.AutoplanError:
            return  # an answer, not a plan (counted below)
        assert plan.tp * plan.pp * plan.dp * plan.cp == plan.world_size <= problem.cluster.num_gpus
        assert plan.micro_batch_size * plan.num_microbatches * plan.dp == 16
        for name, value in pinned.items():
            got = getattr(plan, PLAN_FIELD[name])
            assert getattr(got, "value", got) == value
        assert estimate(problem, plan).peak_memory_gib * 2**30 <= mem_mib * 2**20
        checked.append((tuple(sorted(pinned.items())), mem_mib))

    check()
    assert len(set(checked)) >= MIN_CHECKED, f"only {len(set(checked))} plans checked"


def test_more_memory_never_makes_a_feasible_case_infeasible():
    checked = []

    @SETTINGS
    @given(mem_mib=st.integers(1536, 4096), extra=st.integers(1, 4096))
    def check(mem_mib, extra):
        small = _problem(mem=mem_mib * 2**20)
        try:
            solve_table(small, Pins(), time_limit_s=20)
        except autoplan.InfeasibleError:
            return  # nothing to carry over to more memory (counted below)
        solve_table(_problem(mem=(mem_mib + extra) * 2**20), Pins(), time_limit_s=20)
        checked.append((mem_mib, extra))

    check()
    assert len(set(checked)) >= MIN_CHECKED, f"only {len(set(checked))} cases checked"


def test_a_faster_link_never_makes_the_estimate_slower():
    checked = []

    @SETTINGS
    @given(slow=st.integers(1, 399), pinned=pins)
    def check(slow, pinned):
        try:
            plan = plan_from_pins(_problem(inter=f"{slow}Gbps"), Pins(**pinned))
        except autoplan.AutoplanError:
            return  # pins no plan can take (counted below)
        slow_s = estimate(_problem(inter=f"{slow}Gbps"), plan).step_time_s
        fast_s = estimate(_problem(inter=f"{slow + 1}Gbps"), plan).step_time_s
        assert fast_s <= slow_s
        checked.append((slow, tuple(sorted(pinned.items()))))

    check()
    assert len(set(checked)) >= MIN_CHECKED, f"only {len(set(checked))} plans checked"


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed", "fsdp"])
@given(params=st.floats(1e6, 1e12), dp=st.integers(1, 4096))
@SETTINGS
def test_a_higher_zero_stage_never_raises_model_state_memory(runtime, params, dp):
    profile = runtime_profile(runtime)
    totals = [model_state_bytes(params, zero_stage=z, dp=dp, offload=Offload.NONE,
                                runtime=profile).total for z in range(4)]
    assert totals == sorted(totals, reverse=True)
