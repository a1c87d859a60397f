"""``autoplan trace --json``: the documented keys, figures for the requested batch."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import autoplan
from autoplan.cli import app

TINY_GPT = str(Path(__file__).parents[2] / "examples/models/tiny_gpt.py")
LAYER_KEYS = {"name", "kind", "params", "fwd_flops", "bwd_flops", "activation_bytes",
              "boundary_bytes", "tp_split"}


def _trace(*flags: str) -> dict:
    result = CliRunner().invoke(app, ["trace", TINY_GPT, "--json", *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_document_scales_with_batch():
    one, four = _trace("--seq-len", "64"), _trace("--seq-len", "64", "--batch", "4")
    assert {"num_params", "fwd_flops", "bwd_flops", "layers"} <= set(one)
    assert all(LAYER_KEYS <= set(layer) for layer in one["layers"])
    assert four["num_params"] == one["num_params"]
    assert four["fwd_flops"] == 4 * one["fwd_flops"]
    assert [l["activation_bytes"] for l in four["layers"]] == [4 * l["activation_bytes"] for l in one["layers"]]


def test_table_prints_totals():
    result = CliRunner().invoke(app, ["trace", TINY_GPT, "--seq-len", "64"])
    assert result.exit_code == 0 and "parameters" in result.output


def test_trace_reports_the_constraints_tp_must_respect():
    # Llama 2 70B: 64 heads, 8 KV heads; vocabulary 32000 padded by Megatron to a multiple of
    # 128 x tp: 32000 = 250 x 128, so tp 1 and 2 keep it, tp 4 -> 32256 (63 x 512), tp 8 -> 32768.
    document = autoplan.api.trace_document(
        autoplan.load_model(Path(__file__).parents[2] / "examples/models/llama2_70b.py").trace(128))
    constraints = document["tp_constraints"]
    assert sorted(constraints["divides"]) == [8, 64]
    assert constraints["padded_vocab"] == {1: 32000, 2: 32000, 4: 32256, 8: 32768}
