"""Fixtures shared by the cost-model tests."""

from __future__ import annotations

import types

import pytest

from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
from autoplan.zoo import Llama, LlamaConfig, next_token_loss


@pytest.fixture(scope="session")
def llama_graph():
    """A two-block Llama (h 256, 8 heads of 32, 2 KV heads, SwiGLU F 896) traced at 64 tokens in
    bf16: small enough to count its per-block bytes by hand."""
    module = types.ModuleType("small_llama")
    module.build_model = lambda: Llama(LlamaConfig(
        num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=2, ffn_hidden_size=896,
        vocab_size=1024))
    module.loss = next_token_loss
    return trace_model(load_model_source(module), seq_len=64, precision="bf16")
