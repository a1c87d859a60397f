"""explain: runners-up agree with pinned solves, binding constraints, what-ifs and warnings."""

from __future__ import annotations

import json
import math
import re

import pytest
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.plan import one_line

from .conftest import DGX16, ETHERNET, EXAMPLES, TINY

FOUR_GPU_NODES = {"gpu": "a100-sxm4-80gb", "nodes": 2, "gpus_per_node": 2,
                  "intra_node": {"link": "nvswitch"},
                  "inter_node": {"link": "infiniband", "bandwidth": "200Gbps"}}


@pytest.fixture(scope="module")
def solved(tiny):
    return api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16)


@pytest.fixture(scope="module")
def explained(solved, tiny):
    return api.explain(solved, tiny)


def test_runners_up_match_pinned_solves(explained, solved, tiny):
    assert explained.runners_up
    for runner in explained.runners_up:
        assert (runner.tp, runner.pp) != (solved.plan.tp, solved.plan.pp)
        assert runner.fits
        # Runners-up are other shapes on the chosen plan's runtime.
        alone = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16,
                          pins={"tp": runner.tp, "pp": runner.pp},
                          runtime=solved.training.runtime)
        assert runner.step_time_s == pytest.approx(alone.estimate.step_time_s, rel=1e-9)
        assert runner.plan == one_line(alone.plan)
        assert runner.slower_by >= 0  # the chosen plan is the optimum
    times = [r.step_time_s for r in explained.runners_up]
    assert times == sorted(times)


def test_memory_binds_under_a_tight_limit():
    """On a GPT-J 6B, whose GEMMs outlast the host's kernel launches: the tiny model's blocks
    are host-bound (costmodels/host.py), so shapes tie and a tighter limit need not bind."""
    model = api.load_model(EXAMPLES / "models" / "gptj_6b.py")
    loose = api.solve(model, FOUR_GPU_NODES, seq_len=2048, global_batch=16)
    peak = loose.estimate.peak_memory_gib
    tight = api.solve(model, FOUR_GPU_NODES, seq_len=2048, global_batch=16,
                      mem_limit=f"{peak - 0.01:.3f}GiB", headroom=0)
    text = api.explain(tight, model).binding
    assert text.startswith("memory:") and "pipeline stage" in text
    more = api.explain(tight, model).what_ifs[0]
    assert more.change.startswith("1.5x GPU memory")
    assert more.step_time_s <= tight.estimate.step_time_s


def test_nothing_binds_for_the_unconstrained_optimum(explained):
    assert explained.binding.startswith("nothing binds")


def test_pinned_plan_is_flagged(tiny):
    pinned = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, pins={"tp": 4})
    unpinned = api.explain(pinned, tiny)
    assert unpinned.binding.startswith(("pins:", "nothing binds"))
    assert any("was the plan pinned" in w for w in unpinned.warnings) or \
        unpinned.binding.startswith("nothing binds")
    kept = api.explain(pinned, tiny, pins={"tp": 4})
    assert not any("was the plan pinned" in w for w in kept.warnings)


def test_warns_tp_across_nodes(tiny):
    result = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, pins={"tp": 4})
    assert any(w.startswith("TP=4 spans nodes") for w in api.explain(result, tiny, pins={"tp": 4}).warnings)


def test_warns_zero3_over_ethernet(tiny):
    pins = {"zero": 3, "tp": 1, "pp": 1, "dp": 16}  # both nodes: the DP group crosses Ethernet
    result = api.solve(tiny, ETHERNET, seq_len=256, global_batch=16, runtime="deepspeed", pins=pins)
    warnings = api.explain(result, tiny, pins=pins).warnings
    assert any(w.startswith("ZeRO-3 over a slow network") for w in warnings)


def test_warns_multi_node_no_faster_than_one(tiny):
    """The tiny GPT over 10 Gb/s Ethernet: a second node cannot help."""
    result = api.solve(tiny, ETHERNET, seq_len=256, global_batch=16)
    warnings = api.explain(result, tiny).warnings
    assert any(w.startswith(("bandwidth-bound", "poor scaling")) for w in warnings)


def test_cli_explain_and_plots(solved, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(solved.model_dump(mode="json")))
    result = CliRunner().invoke(app, ["explain", str(path), "--model", str(TINY), "--json",
                                      "--plots", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"plan", "step_time_s", "binding", "bottleneck", "runners_up", "what_ifs",
                        "warnings", "tp_modes", "frameworks"}
    for name in ("memory_per_stage.png", "plan_on_cluster.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_cli_solve_explain_json():
    result = CliRunner().invoke(app, ["solve", str(TINY), str(DGX16), "--seq-len", "128",
                                      "--global-batch", "16", "--explain", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["plan"]["world_size"] <= 128 and doc["explanation"]["runners_up"]


def test_rank_coordinates_follow_the_placement(solved):
    from autoplan.plots import rank_coordinates
    p = solved.plan
    seen = {tuple(rank_coordinates(solved, r).values()) for r in range(p.world_size)}
    assert len(seen) == p.world_size  # every rank has its own coordinates
    assert rank_coordinates(solved, 1)["tp"] == (1 if p.tp > 1 else 0)


def test_tp_modes_table_for_the_plans_tp(tiny):
    """explain lists 1D/2D/2.5D/3D TP traffic for the plan's TP size and model."""
    from autoplan.plugins.colossalai_tp import compare_tp_modes

    result = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, pins={"tp": 4})
    rows = api.explain(result, tiny, pins={"tp": 4}).tp_modes
    assert [r.mode for r in rows] == ["1D", "2D", "2.5D", "3D"]
    expected = compare_tp_modes(tp=4, hidden=128, tokens=result.plan.micro_batch_size * 256)
    assert [r.bytes_per_layer_per_gpu for r in rows] == [e.bytes_per_gpu for e in expected]
    assert rows[0].gpus == 4 and rows[0].vs_1d == 1


def test_tp_modes_table_printed(tmp_path, tiny):
    result = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, pins={"tp": 2})
    path = tmp_path / "plan.json"
    path.write_text(result.model_dump_json())
    out = CliRunner().invoke(app, ["explain", str(path), "--model", str(TINY)],
                             terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "TP mode" in out.output and "2.5D" in out.output and "vs 1D" in out.output


def _other_model(tmp_path, layers: int):
    """A GPT of the zoo with ``layers`` blocks: another model than tiny_gpt."""
    path = tmp_path / f"gpt_{layers}.py"
    path.write_text(
        "from autoplan.zoo.gpt import GPT, GPTConfig\n\n\ndef build_model():\n"
        f"    return GPT(GPTConfig(num_layers={layers}, hidden_size=128, num_heads=4, "
        "vocab_size=1024, max_seq_len=256))\n")
    return path


@pytest.mark.parametrize("layers", [1, 40])
def test_explaining_a_plan_with_another_model_says_they_do_not_match(solved, tmp_path, layers):
    """A plan from tiny_gpt explained against a GPT of another depth: exit 2 saying the plan
    does not match the model (was: IndexError in costmodels/step.py for the shallower one)."""
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(solved.model_dump_json())
    result = CliRunner().invoke(app, ["explain", str(plan_json), "--model",
                                      str(_other_model(tmp_path, layers))])
    assert result.exit_code == 2, result.output
    assert "the plan does not match the model" in " ".join(result.output.split())


def test_explain_says_how_far_behind_each_other_framework_is(explained, solved):
    others = [o for o in solved.runtimes if o.runtime != solved.training.runtime]
    assert len(explained.frameworks) == len(others) == 2
    for line, option in zip(explained.frameworks, others):
        if option.plan is None:
            assert "no plan" in line
        else:  # its step time against the chosen plan's, worked from the runtimes list
            behind = option.step_time_s / solved.estimate.step_time_s - 1
            assert f"{behind:+.1%} per step" in line and behind >= 0


# --- What binds a plan at or over the memory limit (issue 14 item 17a).

EQUAL_AS_A_MISS = re.compile(r"(\d+\.\d+) GiB \(limit \1 GiB|(\d+\.\d+) of \2 GiB")


def test_a_plan_over_the_limit_is_said_not_to_fit_and_the_fitting_optimum_named(tiny):
    """An estimated plan 51 MiB over its limit: not "memory: N faster candidates do not fit"
    (it does not fit itself), but by how much it misses and which plan fits instead (the
    solve's own answer under the same limit)."""
    pins = {"tp": 1, "pp": 1, "dp": 1, "mbs": 16, "zero": 0, "recompute": "none"}  # one GPU
    peak = api.estimate(tiny, FOUR_GPU_NODES, pins, seq_len=256,
                        global_batch=16).estimate.peak_memory_gib
    over = api.estimate(tiny, FOUR_GPU_NODES, pins, seq_len=256, global_batch=16,
                        mem_limit=f"{peak - 0.05:.4f}GiB")
    limit = over.estimate.memory_limit_gib
    assert not over.estimate.feasible
    best = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, headroom=0,
                     mem_limit=f"{peak - 0.05:.4f}GiB", runtime=over.training.runtime)
    text = api.explain(over, tiny).binding
    assert text.startswith("memory: the plan does not fit: ")
    # whole MiB as the solver compares them: the need rounded up, the limit down (~51 MiB)
    assert f"{math.ceil(peak * 1024) - math.floor(limit * 1024)} MiB over the limit" in text
    assert f"the fastest plan that fits, {one_line(best.plan)}, " in text
    assert not EQUAL_AS_A_MISS.search(text)


def test_a_pinned_plan_that_fits_is_bound_by_its_pins_not_memory(tiny):
    pinned = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, pins={"tp": 4})
    best = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16,
                     runtime=pinned.training.runtime)
    assert one_line(best.plan) != one_line(pinned.plan)
    text = api.explain(pinned, tiny).binding
    assert text.startswith(f"pins: the fastest plan that fits, {one_line(best.plan)}, ")
    faster = 1 - best.estimate.step_time_s / pinned.estimate.step_time_s
    assert f"{faster:.1%} less than this plan's" in text


def test_a_plan_at_the_limit_shows_what_is_left_not_equal_numbers(tiny):
    """The optimum under a limit 2 MiB above its own peak: "1.6xxx of 1.6 GiB, 2 MiB to
    spare", never "1.6 of 1.6 GiB"."""
    loose = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16)
    peak = loose.estimate.peak_memory_gib
    at = api.solve(tiny, FOUR_GPU_NODES, seq_len=256, global_batch=16, headroom=0,
                   mem_limit=f"{peak + 2 / 1024:.6f}GiB")
    assert one_line(at.plan) == one_line(loose.plan)
    text = api.explain(at, tiny).binding
    spare = (at.estimate.memory_limit_gib - peak) * 1024  # 2 MiB, to the rounding of the limit
    assert f"{spare:,.0f} MiB to spare" in text
    assert not EQUAL_AS_A_MISS.search(text)


def test_what_if_percentages_say_what_they_compare_with(solved, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(solved.model_dump(mode="json")))
    result = CliRunner().invoke(app, ["explain", str(path), "--model", str(TINY)])
    assert result.exit_code == 0, result.output
    what_ifs = [line for line in result.output.splitlines() if line.startswith("what if")]
    assert what_ifs and all("nothing fits" in line or "speed vs this plan" in line
                            for line in what_ifs)
    assert "vs this plan" in next(line for line in result.output.splitlines()
                                  if line.startswith("┃ TP"))
