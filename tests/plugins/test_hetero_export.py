"""Plans whose stages run on the node groups of a heterogeneous cluster: torchrun and Megatron-LM
start each stage's ranks on its group's hosts with the planned layer counts (checked by
megatron-core's own partition code); the other targets refuse, naming those two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autoplan
from autoplan.cli import app
from autoplan.errors import ExportError
from autoplan.plugins import export_plan, render_all
from autoplan.plugins.megatron import megatron_args
from tests.plugins.test_megatron import built_partition, planned_blocks, transformer_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def dgx_group(name: str, preset: str, hosts: list[str]) -> dict:
    return {"name": name, "preset": preset, "nodes": len(hosts),
            "hosts": [{"name": h, "ip": f"10.0.{ord(name[0])}.{i}"} for i, h in enumerate(hosts)]}


CLUSTER = {"name": "mixed", "groups": [dgx_group("a100", "dgx-a100", ["a0", "a1"]),
                                       dgx_group("v100", "dgx-1-v100", ["v0", "v1"])]}


@pytest.fixture(scope="module")
def result():
    """TP 4 x DP 4 fills two nodes per stage, so PP 2 needs both groups."""
    return autoplan.solve(EXAMPLES / "models" / "tiny_gpt.py", CLUSTER, seq_len=64,
                          global_batch=16, pins={"tp": 4, "dp": 4, "pp": 2}, runners_up=False)


def test_the_plan_spans_both_groups(result):
    assert sorted(result.plan.stage_groups) == ["a100", "v100"]


def test_torchrun_starts_each_stage_on_its_groups_hosts(result):
    files = render_all(result, "torchrun")
    stages = json.loads(files["plan.json"])["stages"]
    assert [s["group"] for s in stages] == list(result.plan.stage_groups)
    first, second = result.plan.stage_groups
    script = files["launch_torchrun.sh"]
    assert f"# node ranks 0-1: node group {first}" in script
    assert f"# node ranks 2-3: node group {second}" in script
    # Ranks are pipeline-outermost: node ranks 0-1 hold stage 0, so they are its group's hosts.
    hosts = {"a100": ["a0", "a1"], "v100": ["v0", "v1"]}
    for rank, host in enumerate(hosts[first] + hosts[second]):
        assert f"    {host}|" in script and f") NODE_RANK={rank} ;;" in script.split(f"    {host}|")[1].split("\n")[0]


def test_megatron_builds_the_planned_layer_counts(result):
    args = megatron_args(result)
    assert built_partition(transformer_config(args)) == planned_blocks(result)


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan", "accelerate", "colossalai"])
def test_other_targets_refuse_naming_those_that_can(result, target):
    with pytest.raises(ExportError, match="--to torchrun or --to megatron"):
        render_all(result, target)


def test_all_exports_what_can_run_it(result, tmp_path):
    written = {p.name for p in export_plan(result, "all", tmp_path)}
    assert {"launch_torchrun.sh", "launch_megatron.sh"} <= written
    assert "ds_config.json" not in written


def test_cli_refusal_exits_2(result, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(result.model_dump(mode="json")))
    run = CliRunner().invoke(app, ["export", str(path), "--to", "deepspeed", "--out",
                                   str(tmp_path / "out")])
    assert run.exit_code == 2 and "node groups" in run.output + (run.stderr or "")
