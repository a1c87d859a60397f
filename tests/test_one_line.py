"""One plan one-liner everywhere (issue 14 item 15): every degree that is not 1 (CP, EP) shows
in the report, the sweep table and CSV, the infeasibility message and the launch files."""

from __future__ import annotations

import csv

import pytest
from rich.console import Console
from typer.testing import CliRunner

from autoplan import api
from autoplan import sweep as sweeps
from autoplan.cli import app
from autoplan.plan import Plan, Stage, one_line
from autoplan.plugins.summary import summary_lines

TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def _plan(**changes) -> Plan:
    fields = dict(tp=8, pp=16, dp=64, cp=2, ep=8, zero_stage=1, micro_batch_size=1,
                  global_batch_size=1024, num_microbatches=16, world_size=8 * 16 * 64 * 2,
                  vpp=2, sequence_parallel=True, recompute="selective",
                  stages=tuple(Stage(first_layer=i, num_layers=1) for i in range(32)))
    return Plan(**{**fields, **changes})


def test_the_one_liner_names_every_degree_and_switch():
    assert one_line(_plan()) == ("TP8 x PP16 x DP64 x CP2 x EP8, VPP2, mbs 1, ZeRO-1, "
                                 "selective recompute, SP")
    plain = _plan(cp=1, ep=1, vpp=1, world_size=8 * 16 * 64, sequence_parallel=False,
                  recompute="full", recompute_num_layers=2, offload="optimizer",
                  placement="tp-cp-pp-dp", stages=tuple(Stage(first_layer=i, num_layers=1)
                                                        for i in range(16)))
    assert one_line(plain) == ("TP8 x PP16 x DP64, mbs 1, ZeRO-1, full recompute of 2 blocks "
                               "per chunk, offload optimizer, placement tp-cp-pp-dp")


def test_the_launch_files_say_cp_and_ep():
    result = api.estimate(TINY, DGX1, {"cp": 2, "dp": 4}, seq_len=256, global_batch=16)
    lines = summary_lines(result)
    assert "Plan: TP1 x PP1 x DP4 x CP2, mbs 1, ZeRO-0, no recompute on 8 GPUs" in " ".join(lines)


def test_the_infeasibility_message_says_cp():
    """DP 4 x CP 2 was reported as "DP=4". The limit lies between the leanest plan of the pins
    (8 GPUs = CP 2 x DP 4, so TP 1, PP 1) and a leaner TP 2 x DP 4 plan, so both pins conflict
    with the memory and the message names the pinned plan that does not fit."""
    lean = {"zero": 1, "recompute": "full", "offload": "optimizer"}
    pinned = api.estimate(TINY, DGX1, {"cp": 2, "dp": 4, **lean}, seq_len=256, global_batch=16)
    tp2 = api.estimate(TINY, DGX1, {"tp": 2, "dp": 4, "sp": True, **lean}, seq_len=256,
                       global_batch=16)
    low, high = tp2.estimate.peak_memory_gib, pinned.estimate.peak_memory_gib
    assert low < high
    result = CliRunner().invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                      "16", "--cp", "2", "--dp", "4", "--runtime", "megatron",
                                      "--headroom", "0", "--mem-limit",
                                      f"{(low + high) / 2:.6f}GiB"])
    assert result.exit_code == 3, result.output
    assert "(TP1 x PP1 x DP4 x CP2, mbs 1, ZeRO-1" in " ".join(result.output.split())


def test_the_sweep_table_and_csv_carry_cp_and_ep(tmp_path):
    """A sweep point's plan replaced by a CP plan (sweeps search CP only from 8192 tokens)."""
    doc = sweeps.sweep(TINY, DGX1, over={"nodes": [1]}, base={"seq_len": 256, "global_batch": 16},
                    workers=1)
    cp_plan = api.estimate(TINY, DGX1, {"cp": 2, "dp": 4}, seq_len=256, global_batch=16).plan
    doc["points"][0]["plan"] = cp_plan.model_dump(mode="json")
    sweeps.write_sweep(doc, tmp_path)
    with open(tmp_path / "sweep.csv") as handle:
        row = next(csv.DictReader(handle))
    assert (row["plan_cp"], row["plan_ep"]) == ("2", "1")
    assert "x CP2," in row["plan"]
    console = Console(width=200, record=True)
    sweeps.render(doc, console)
    assert "x CP2," in console.export_text()


def test_the_solve_report_lists_runners_up_by_their_one_liner():
    result = CliRunner().invoke(app, ["solve", TINY, DGX1, "--seq-len", "256",
                                      "--global-batch", "16", "--cp", "2"])
    assert result.exit_code == 0, result.output
    assert "x CP2, mbs" in result.output.split("Runners-up")[1]


def test_the_memory_figure_has_whole_stage_ticks_and_the_one_liner(monkeypatch, tmp_path):
    from autoplan import plots
    result = api.estimate(TINY, DGX1, {"pp": 3, "dp": 2}, seq_len=256, global_batch=16)
    kept = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.setdefault("fig", fig))
    plots.memory_per_stage(result, tmp_path / "m.png")
    ax = kept["fig"].axes[0]
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert ax.get_title() == f"tiny_gpt: {one_line(result.plan)}"
