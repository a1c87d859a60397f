"""In-memory model.py modules for the tracer tests: ``build_model`` (and optional
``example_inputs``/``loss``) on a module object, as ``api.load_model`` accepts."""

from __future__ import annotations

import types
from typing import Any, Callable

from autoplan.zoo import GPT, GPTConfig, Llama, LlamaConfig, next_token_loss


def model_file(name: str, build: Callable[[], Any], *, inputs: Callable | None = None,
               loss: Callable | None = None) -> types.ModuleType:
    """A module object that satisfies the model.py contract."""
    module = types.ModuleType(name)
    module.build_model = build
    if inputs is not None:
        module.example_inputs = inputs
    if loss is not None:
        module.loss = loss
    return module


GPT_SMALL = GPTConfig(num_layers=3, hidden_size=64, num_heads=4, vocab_size=256, max_seq_len=128,
                      dropout=0.0)
LLAMA_GQA = LlamaConfig(num_layers=3, hidden_size=64, num_heads=8, num_kv_heads=2,
                        ffn_hidden_size=176, vocab_size=256)

gpt_small = model_file("gpt_small", lambda: GPT(GPT_SMALL), loss=next_token_loss)
llama_gqa = model_file("llama_gqa", lambda: Llama(LLAMA_GQA), loss=next_token_loss)
