"""export_plan: discovery, overwrite refusal, atomic writes, shell quoting, golden files.

Golden files in tests/plugins/golden/<plan>/ show every output change in review; after an
intended change regenerate them with ``AUTOPLAN_REGEN_GOLDEN=1 pytest tests/plugins``.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from autoplan.errors import ExportError
from autoplan.plan import one_line
from autoplan.plugins import BUILTIN, EXPORTERS, discover, export_plan, refused_targets
from tests.plugins.plans import PLAN_NAMES, changed, load_plan

GOLDEN = Path(__file__).parent / "golden"
REFUSED_FILE = "_refused.txt"


def test_builtin_exporters_are_discovered():
    assert set(EXPORTERS) == set(BUILTIN)
    assert discover().keys() == EXPORTERS.keys()


def test_builtins_are_used_when_no_entry_points_are_installed(monkeypatch):
    import autoplan.plugins as plugins
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    assert {name: e.name for name, e in plugins.discover().items()} == {n: n for n in BUILTIN}


def test_refuses_to_overwrite_without_force_and_writes_nothing(tmp_path):
    result = load_plan("gpt13b_ethernet_10g")
    export_plan(result, "deepspeed", tmp_path)
    (tmp_path / "hostfile").write_text("mine\n")
    (tmp_path / "ds_config.json").unlink()
    with pytest.raises(ExportError, match=r"hostfile.*pass --force"):
        export_plan(result, "deepspeed", tmp_path)
    assert (tmp_path / "hostfile").read_text() == "mine\n"
    assert not (tmp_path / "ds_config.json").exists()


def test_force_overwrites_and_leaves_no_temporary_files(tmp_path):
    result = load_plan("gpt13b_ethernet_10g")
    export_plan(result, "deepspeed", tmp_path)
    (tmp_path / "hostfile").write_text("mine\n")
    paths = export_plan(result, "deepspeed", tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    assert (tmp_path / "hostfile").read_text().endswith("192.168.1.12 slots=8\n")
    assert os.stat(tmp_path / "launch_deepspeed.sh").st_mode & stat.S_IXUSR


def test_unknown_target_names_the_choices(tmp_path):
    with pytest.raises(ExportError, match="megatron"):
        export_plan(load_plan("gpt13b_ethernet_10g"), "nemo", tmp_path)


def test_all_skips_targets_that_refuse_the_plan(tmp_path):
    result = load_plan("llama8b_zero3_offload_1gpu")
    names = {p.name for p in export_plan(result, "all", tmp_path)}
    assert "ds_config.json" in names and "megatron_args.txt" not in names
    # The refusals are listed (the CLI prints them as "not exported: ..."), not logged.
    assert any(line.startswith("megatron: ") for line in refused_targets(result))


def test_a_named_target_that_refuses_raises(tmp_path):
    with pytest.raises(ExportError, match="Megatron-LM cannot run this plan"):
        export_plan(load_plan("llama8b_zero3_offload_1gpu"), "megatron", tmp_path)


@pytest.mark.parametrize("script", ["launch_megatron.sh", "launch_torchtitan.sh",
                                    "launch_deepspeed.sh"])
def test_launch_scripts_are_valid_bash(script, tmp_path):
    export_plan(load_plan("gpt13b_ethernet_10g"), "all", tmp_path)
    subprocess.run(["bash", "-n", str(tmp_path / script)], check=True)


def test_host_names_are_quoted_and_rank_nodes_in_host_order(tmp_path):
    """A hostile host name is matched literally, never executed; torchrun gets node rank 1."""
    evil = "node 2;touch pwned"
    result = load_plan("gpt13b_ethernet_10g")
    cluster = dict(result.cluster, hosts=[{"name": "node-01", "ip": "192.168.1.11"},
                                          {"name": evil, "ip": "192.168.1.12"}])
    export_plan(changed(result, cluster=cluster), "megatron", tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hostname").write_text(f"#!/bin/sh\necho '{evil}'\n")
    (bin_dir / "torchrun").write_text('#!/bin/sh\necho "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/opt/megatron lm"}
    run = subprocess.run(["bash", str(tmp_path / "launch_megatron.sh"), "--train-iters", "10"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert "--node-rank 1 --master-addr 192.168.1.11" in run.stdout
    assert "/opt/megatron lm/pretrain_gpt.py --tensor-model-parallel-size 1" in run.stdout
    assert run.stdout.rstrip().endswith("--bf16 --train-iters 10")
    assert not (tmp_path / "pwned").exists()


def test_no_hosts_makes_master_address_a_required_variable(tmp_path):
    result = load_plan("gpt13b_ethernet_10g")
    cluster = {k: v for k, v in result.cluster.items() if k != "hosts"}
    export_plan(changed(result, cluster=cluster), "megatron", tmp_path)
    text = (tmp_path / "launch_megatron.sh").read_text()
    assert ': "${MASTER_ADDR:?cluster.yaml lists no hosts' in text
    assert ': "${NODE_RANK:?' in text


def golden_outputs(name: str) -> dict[str, str]:
    """Every target's files for one fixture plan, plus the refusals, by file name."""
    result = load_plan(name)
    files, refused = {}, []
    for target, exporter in EXPORTERS.items():
        try:
            files.update(exporter.render(result))
        except ExportError as err:
            refused.append(f"{target}: {err}\n")
    files[REFUSED_FILE] = "".join(refused)
    return files


@pytest.mark.parametrize("name", PLAN_NAMES)
def test_outputs_match_golden_files(name):
    directory = GOLDEN / name
    outputs = golden_outputs(name)
    if os.environ.get("AUTOPLAN_REGEN_GOLDEN"):
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.iterdir():
            stale.unlink()
        for file_name, text in outputs.items():
            (directory / file_name).write_text(text)
    assert sorted(p.name for p in directory.iterdir()) == sorted(outputs), \
        "files differ; AUTOPLAN_REGEN_GOLDEN=1 regenerates after an intended change"
    for file_name, text in outputs.items():
        assert (directory / file_name).read_text() == text, file_name


@pytest.mark.parametrize("name", PLAN_NAMES)
def test_every_commentable_file_starts_with_the_plan_and_its_predictions(name):
    result = load_plan(name)
    for file_name, text in golden_outputs(name).items():
        if file_name.endswith(".json") or file_name in (".deepspeed_env", REFUSED_FILE):
            continue
        assert f"{result.estimate.step_time_s:.3f} s/step" in text.split("\n--")[0], file_name
        assert f"Plan: {one_line(result.plan)} on" in text, file_name


def test_a_placement_no_target_builds_is_refused_everywhere(tmp_path):
    result = changed(load_plan("gpt13b_ethernet_10g"), plan={"placement": "dp-tp-cp-pp"})
    with pytest.raises(ExportError, match="no target can run this plan.*dp-tp-cp-pp"):
        export_plan(result, "all", tmp_path)
