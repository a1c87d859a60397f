"""The local-shard TP check names the line of model code that breaks on TP shards."""

from pathlib import Path

from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
from autoplan.verify.tp_check import local_tp_problem

MODELS = Path(__file__).parent / "models"


def _problem(name: str):
    source = load_model_source(MODELS / f"{name}.py")
    return local_tp_problem(source, trace_model(source, seq_len=32, precision="fp32"), 2)


def test_fused_qkv_split_by_hidden_size_is_named():
    message = _problem("tiny_gpt")
    assert "autoplan/zoo/gpt.py:39" in message
    assert "self.c_attn(x).split(h, dim=2)" in message


def test_hard_coded_head_count_is_named():
    message = _problem("tiny_llama_gqa")
    assert "autoplan/zoo/llama.py:59" in message and "cfg.num_heads" in message


def test_shape_derived_heads_pass():
    assert _problem("local_tp_gpt") is None
