"""Tiny Mixtral models (Hugging Face, built from a config: no download) for the EP searches."""

from __future__ import annotations

from autoplan.api import load_model
from tests.extras import require
from tests.graph.models import model_file

_MODELS: dict = {}


def tiny_moe(layers: int, hidden: int, experts: int, *, ffn: int | None = None):
    """A Mixtral of ``layers`` blocks, ``experts`` experts (top-2), loaded for tracing."""
    transformers = require("transformers")
    key = (layers, hidden, experts, ffn)
    if key not in _MODELS:
        config = transformers.MixtralConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=ffn or 2 * hidden, vocab_size=512,
            num_local_experts=experts, num_experts_per_tok=2)
        _MODELS[key] = load_model(model_file(f"moe_{layers}_{hidden}_{experts}_{ffn}",
                                             lambda: transformers.MixtralForCausalLM(config)))
    return _MODELS[key]
