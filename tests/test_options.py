"""Objectives and the --options file end to end: each key changes the plan as it says, CLI
flags win over the file, and conflicts exit 3 naming the requirements."""

import json

import pytest
from typer.testing import CliRunner

import autoplan
import autoplan.api
from autoplan.cli import app
from autoplan.errors import ConstraintError, InfeasibleError
from autoplan.options import BatchRange, global_batches, load_options

TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def _solve(**kwargs):
    kwargs.setdefault("global_batch", 16)
    return autoplan.solve(TINY, DGX1, seq_len=256, **kwargs)


def _write(tmp_path, text):
    path = tmp_path / "options.yaml"
    path.write_text(text)
    return path


def test_bounds_limit_each_degree():
    plan = _solve(bounds={"tp": {"max": 2}, "pp": {"min": 2}, "dp": {"max": 2},
                          "mbs": {"max": 1}}).plan
    assert plan.tp <= 2 and plan.pp >= 2 and plan.dp <= 2 and plan.micro_batch_size == 1


def test_max_gpus_is_a_budget():
    result = _solve(max_gpus=4)
    assert result.plan.world_size <= 4
    assert result.plan.world_size < _solve().plan.world_size


def test_gpus_objective_reaches_the_throughput_on_fewer_gpus():
    fastest = _solve()
    target = fastest.estimate.tokens_per_s * 0.4
    result = _solve(objective=["gpus", "time"], min_tokens_per_s=target)
    assert result.estimate.tokens_per_s >= target
    assert result.plan.world_size < fastest.plan.world_size
    assert result.solver.objective_unit == "GPUs"
    assert result.solver.objective_terms == ("gpus", "time")


def test_cost_objective_is_never_more_expensive_than_the_fastest_plan():
    fastest, cheapest = _solve(), _solve(objective="cost", price_per_gpu_hour=4.0)
    cost = lambda r: r.plan.world_size / r.estimate.tokens_per_s  # noqa: E731
    assert cost(cheapest) <= cost(fastest)
    assert cheapest.solver.objective_unit == "$/Mtoken"


def test_global_batch_choice_maximizes_throughput():
    result = _solve(global_batch=[8, 32])
    assert result.plan.global_batch_size in (8, 32)
    assert result.training.global_batch == result.plan.global_batch_size
    each = [_solve(global_batch=b).estimate.tokens_per_s for b in (8, 32)]
    assert result.estimate.tokens_per_s == pytest.approx(max(each), rel=1e-6)
    assert result.solver.objective_unit == "s/Mtoken"


def test_batch_range_takes_powers_of_two_and_ends():
    assert BatchRange(min=24, max=100).values() == [24, 32, 64, 100]
    assert global_batches({"min": 8, "max": 16}) == [8, 16]


def test_mem_limit_above_the_gpu_is_refused(tmp_path):
    path = _write(tmp_path, "mem_limit: 200GiB\n")
    with pytest.raises(ConstraintError, match="can only lower"):
        _solve(options=path)


@pytest.mark.parametrize("command", ["solve", "estimate"])
def test_mem_limit_above_the_gpu_is_refused_on_the_command_line_too(command):
    """One rule for the flag and the file: the DGX A100's GPUs hold 80 GiB, so 200GiB is an
    error (exit 2) naming the flag and the GPU's memory, not a plan that "fits" in 152 GiB."""
    result = runner.invoke(app, [command, TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16", "--mem-limit", "200GiB"])
    assert result.exit_code == 2, result.output
    assert "--mem-limit 200GiB exceeds" in result.output
    assert "80.0 GiB" in result.output and "can only lower" in result.output


def test_mem_limit_equal_to_the_gpu_is_accepted():
    assert _solve(mem_limit="80GiB", headroom=0).estimate.memory_limit_gib == pytest.approx(80)


def test_mem_limit_from_the_file_lowers_the_limit(tmp_path):
    result = _solve(options=_write(tmp_path, "mem_limit: 40GiB\n"))
    assert result.estimate.memory_limit_gib == pytest.approx(40 * 0.95)  # less the 5% headroom


def test_forbid_offload_and_tp_within_node(tmp_path):
    path = _write(tmp_path, "forbid_offload: true\ntp_within_node: true\n")
    assert _solve(options=path, mem_limit="2GiB").plan.offload.value == "none"
    with pytest.raises(ConstraintError, match="forbid_offload"):
        _solve(options=path, pins={"offload": "optimizer"})
    # TP 4 across two nodes of 2 GPUs with tp_within_node: a pin and a bound conflict.
    cluster = {"gpu": "a100-sxm4-80gb", "nodes": 2, "gpus_per_node": 2,
               "intra_node": {"link": "nvswitch"},
               "inter_node": {"link": "infiniband", "nics_per_node": 2, "bandwidth": "200Gbps"}}
    with pytest.raises(InfeasibleError, match=r"--tp 4 and tp <= 2 \(bounds\)"):
        autoplan.solve(TINY, cluster, seq_len=256, global_batch=16, pins={"tp": 4},
                       options=path)


def test_misspelt_key_names_it(tmp_path):
    with pytest.raises(ConstraintError, match="max_gpu"):
        load_options(_write(tmp_path, "max_gpu: 4\n"))


def test_cli_flags_win_over_the_file(tmp_path):
    path = _write(tmp_path, "pins: {tp: 1}\nobjective: cost\nmax_gpus: 4\n")
    result = runner.invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16", "--options", str(path), "--tp", "2", "--objective",
                                 "gpus,time", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["plan"]["tp"] == 2 and document["plan"]["world_size"] <= 4
    assert document["solver"]["objective_terms"] == ["gpus", "time"]
    assert isinstance(document["runners_up"], list)
    for row in document["runners_up"]:
        assert set(row) == {"tp", "pp", "dp", "step_time_s", "slower_by", "plan"}


def test_cli_conflict_exits_3_naming_the_pins():
    result = runner.invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16", "--dp", "8", "--options", "/dev/null", "--tp", "2"])
    assert result.exit_code == 2  # tp*dp > GPUs is caught before any search
    # A 7B model unsharded (TP=PP=1, ZeRO-0) needs ~16 bytes per parameter: over 80 GiB.
    result = runner.invoke(app, ["solve", "examples/models/llama2_7b.py", DGX1, "--seq-len",
                                 "2048", "--global-batch", "64", "--tp", "1", "--pp", "1",
                                 "--zero", "0"])
    assert result.exit_code == 3, result.output
    message = " ".join(result.stderr.split())
    assert "--tp 1 and --pp 1 and --zero 0 together with 76.0 GiB per GPU" in message
    # Megatron's states unsharded: bf16 weights 2 + fp32 main grads 4 + Adam 12 = 18 bytes per
    # parameter, 18 * 6,738,415,616 / 2**30 = 112.96 GiB; on top one full-recompute block's
    # working set, the loss, the CUDA context and workspaces: a few GiB
    need = float(message.split("needs ")[1].split(" GiB on stage 0")[0])
    assert 112.96 < need < 112.96 + 4
    assert "without --tp 1 the best plan" in message


def test_solve_report_prints_runners_up():
    result = runner.invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16"])
    assert result.exit_code == 0, result.output
    assert "Runners-up" in result.stdout


def test_old_json_without_runners_up_still_validates():
    document = _solve().model_dump(mode="json")
    document.pop("runners_up")
    for key in ("objective_terms", "objective_unit"):
        document["solver"].pop(key)
    assert autoplan.Result.model_validate(document).runners_up is None


def test_solve_and_explain_agree_on_runners_up():
    result = _solve(mem_limit="1.6GiB", headroom=0)
    explanation = autoplan.api.explain(result, TINY)
    from_explain = [(u.tp, u.pp, round(u.step_time_s * 1e6)) for u in explanation.runners_up
                    if u.fits]
    from_solve = [(u.tp, u.pp, round(u.step_time_s * 1e6)) for u in result.runners_up]
    # solve reports the best few shapes; explain ranks them all the same way.
    assert from_explain[:len(from_solve)] == from_solve


def test_unknown_objective_is_exit_2():
    result = runner.invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16", "--objective", "speed"])
    assert result.exit_code == 2
    assert "objective" in result.stderr
