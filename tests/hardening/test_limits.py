"""Limits, the fast versions of benchmarks/limits.py: 100,000 GPUs, a 1,000-block model and a
10-group heterogeneous cluster each come back under a time limit with a plan, its status and
its gap. How fast is the benchmark's to print (tests check answers, not wall-clock time)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

import autoplan
from autoplan.cli import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def dgx(gpu: str, nodes: int) -> dict:
    return {"gpu": gpu, "nodes": nodes, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps"}}


def _solved_within(model, cluster, limit_s: float, **training):
    model = autoplan.load_model(model)
    model.trace(training["seq_len"])  # tracing is not under the solver's limit
    result = autoplan.solve(model, cluster, time_limit_s=limit_s, **training)
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


def test_ten_heterogeneous_groups_solve_or_return_the_best_with_its_gap(tmp_path):
    """Issue 10: ten groups of five GPU kinds and 2-11 nodes each."""
    result = _solved_within(EXAMPLES / "models" / "tiny_gpt.py", GROUPS, 3, seq_len=64,
                            global_batch=64)
    names = {g["name"] for g in GROUPS["groups"]}
    assert set(result.plan.stage_groups) <= names
    est = result.estimate
    assert all(m <= l for m, l in zip(est.stage_memory_gib, est.stage_memory_limit_gib))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(GROUPS))
    shown = CliRunner().invoke(app, ["solve", str(EXAMPLES / "models" / "tiny_gpt.py"), str(path),
                                     "--seq-len", "64", "--global-batch", "64",
                                     "--time-limit", "3", "--json"])
    assert shown.exit_code == 0
    document = json.loads(shown.output)
    assert document["solver"]["status"] in ("OPTIMAL", "FEASIBLE")
    assert all(stage["group"] in names for stage in document["plan"]["stages"])
