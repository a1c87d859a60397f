"""Limits, the fast versions of benchmarks/limits.py: 100,000 GPUs, a 1,000-block model and a
10-group heterogeneous cluster each come back (a plan with its status and gap, or a clear
refusal) within the time limit; nothing hangs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import autoplan
from autoplan.cli import app
from autoplan.errors import ConstraintError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SLACK_S = 3.0  # building the table's last group and the estimate may run past the limit


def dgx(gpu: str, nodes: int) -> dict:
    return {"gpu": gpu, "nodes": nodes, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps"}}


def _solved_within(model, cluster, limit_s: float, **training):
    model = autoplan.load_model(model)
    model.trace(training["seq_len"])  # tracing is not under the solver's limit
    start = time.perf_counter()
    result = autoplan.solve(model, cluster, time_limit_s=limit_s, **training)
    assert time.perf_counter() - start < limit_s + SLACK_S
    assert result.solver.status in ("OPTIMAL", "FEASIBLE")
    assert 0 <= result.solver.gap <= 1 and result.solver.bound <= result.solver.objective
    return result


def test_one_hundred_thousand_gpus():
    result = _solved_within(EXAMPLES / "models" / "tiny_gpt.py", dgx("h100-sxm5-80gb", 12_500),
                            5, seq_len=64, global_batch=100_000)
    assert 1 <= result.plan.world_size <= 100_000


def test_a_thousand_blocks(tmp_path):
    path = tmp_path / "gpt_1000.py"
    path.write_text("from autoplan.zoo import GPT, GPTConfig\n\n\ndef build_model():\n"
                    "    return GPT(GPTConfig(num_layers=1000, hidden_size=64, num_heads=4,"
                    " vocab_size=256, max_seq_len=64))\n")
    result = _solved_within(path, dgx("a100-sxm4-80gb", 2), 2, seq_len=64, global_batch=64)
    assert result.plan.num_layers == len(result.model.layer_kinds) >= 1000


GROUPS = {"name": "ten", "groups": [
    {**dgx(gpu, 2 + i), "name": f"g{i}"} for i, gpu in enumerate(
        ["a100-sxm4-80gb", "a100-sxm4-40gb", "h100-sxm5-80gb", "v100-sxm2-32gb", "h200-sxm-141gb"] * 2)]}


def test_ten_heterogeneous_groups_are_refused_fast_and_clearly(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ConstraintError) as caught:
        autoplan.solve(EXAMPLES / "models" / "tiny_gpt.py", GROUPS, seq_len=64, global_batch=8)
    assert time.perf_counter() - start < 1.0  # refused before tracing
    message = str(caught.value)
    assert "not supported yet" in message and "Plan for one group" in message
    assert all(f"g{i} ({2 + i}x8 " in message for i in range(10))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(GROUPS))
    result = CliRunner().invoke(app, ["solve", str(EXAMPLES / "models" / "tiny_gpt.py"), str(path),
                                      "--seq-len", "64", "--global-batch", "8"])
    assert result.exit_code == 2 and "mixes kinds of node" in result.stderr
