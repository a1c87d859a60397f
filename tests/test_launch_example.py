"""examples/launch_megatron_with_autoplan.py: plans at start-up, then launches with the plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autoplan import api
from autoplan.plugins.importers import read_run

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "examples" / "launch_megatron_with_autoplan.py"
TINY = ROOT / "examples" / "models" / "tiny_gpt.py"
DGX = ROOT / "examples" / "clusters" / "dgx-a100-x1.yaml"


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LAUNCHER), str(TINY), str(DGX), *args],
                          capture_output=True, text=True, timeout=300)


def test_dry_run_command_holds_the_planned_degrees(tmp_path):
    run = launch("--seq-len", "256", "--global-batch", "16", "--tp", "2", "--pp", "auto",
                 "--micro-batch-size", "auto", "--megatron-lm", "/opt/Megatron-LM", "--dry-run",
                 "--", "--data-path", "/data/corpus", "--lr", "3e-4")
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip()
    assert "torchrun --nnodes 1 --nproc-per-node 8 --node-rank 0 --master-addr 10.0.0.1" in line
    assert "/opt/Megatron-LM/pretrain_gpt.py" in line
    assert line.endswith("--data-path /data/corpus --lr 3e-4")  # the user's arguments last

    expected = api.solve(TINY, DGX, seq_len=256, global_batch=16, pins={"tp": 2}).plan
    saved = tmp_path / "launch.sh"
    saved.write_text(line + "\n")
    imported = read_run(saved)  # read the command back as autoplan reads any Megatron launch
    assert imported.framework == "megatron"
    assert imported.pins["tp"] == 2 == expected.tp
    assert imported.pins["pp"] == expected.pp
    assert imported.pins["mbs"] == expected.micro_batch_size
    assert (imported.seq_len, imported.global_batch) == (256, 16)


def test_bad_pin_is_refused_before_planning():
    run = launch("--seq-len", "256", "--global-batch", "16", "--tp", "two", "--dry-run")
    assert run.returncode == 2
    assert "expected 'auto' or a whole number" in run.stderr
