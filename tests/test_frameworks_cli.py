"""Which framework, on the command line: the runtimes list, the report's comparison, the exit-3
message for a pin a runtime lacks, and sweeping the runtime."""

import json

import pytest
from typer.testing import CliRunner

from autoplan.cli import app

runner = CliRunner()
TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
ENTRY_KEYS = {"runtime", "status", "step_time_s", "peak_memory_gib", "plan", "reason"}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_solve_without_runtime_lists_all_three_and_picks_the_fastest():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    entries = doc["runtimes"]
    assert [e["runtime"] for e in entries] == ["megatron", "deepspeed", "fsdp"]
    assert all(set(e) == ENTRY_KEYS for e in entries)
    assert all(e["plan"] is not None or e["reason"] for e in entries)
    fastest = min(e["step_time_s"] for e in entries if e["plan"])
    assert doc["estimate"]["step_time_s"] == fastest
    chosen = next(e for e in entries if e["runtime"] == doc["training"]["runtime"])
    assert chosen["plan"] == doc["plan"]


def test_the_report_compares_the_frameworks_and_says_which_to_use():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "Best plan per framework" in text
    assert all(name in text for name in ("Megatron-LM", "DeepSpeed", "FSDP"))
    assert "Use " in text and "faster per step than" in text


def test_zero3_on_megatron_exits_3_naming_deepspeed_and_fsdp():
    result = run("solve", TINY, DGX1, "--seq-len", 256, "--global-batch", 16, "--zero", 3,
                 "--runtime", "megatron")
    assert result.exit_code == 3
    assert ("--zero 3 --runtime megatron: Megatron-LM runs ZeRO-3 as Megatron-FSDP's "
            "optim_grads_params, which autoplan does not price; DeepSpeed and FSDP do") in \
        " ".join(result.output.split())


def test_sweep_over_runtime_solves_each_framework(tmp_path):
    result = run("sweep", TINY, DGX1, "--over", "runtime=megatron,deepspeed,fsdp",
                 "--seq-len", 256, "--global-batch", 16, "--workers", 1, "--json")
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)["points"]
    assert [p["inputs"]["runtime"] for p in points] == ["megatron", "deepspeed", "fsdp"]
    assert [p["runtime"] for p in points] == ["megatron", "deepspeed", "fsdp"]
