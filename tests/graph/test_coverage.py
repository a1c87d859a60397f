"""Hugging Face architectures built from a config (no download) trace and plan: parameters
equal the real CPU model's, attention and the TP plan are found, and ``autoplan.solve`` returns a
plan on one DGX A100 node."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.extras import require

transformers = require("transformers")

import autoplan  # noqa: E402
from autoplan.api import load_model  # noqa: E402
from autoplan.graph.layer_graph import LayerKind, TpSplit  # noqa: E402
from tests.graph.models import model_file  # noqa: E402

ROOT = Path(__file__).parents[2]
CLUSTER = ROOT / "examples/clusters/dgx-a100-x1.yaml"
T = transformers
TOKENS = {"vocab_size": 512}


def _seq2seq(b, s):
    tokens = torch.zeros(b, s, dtype=torch.long)
    return {"input_ids": tokens, "decoder_input_ids": tokens}


# name -> (build, example_inputs or None, (heads, kv heads) or None when no attention)
CASES = {
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=128, **TOKENS)), None, (4, 4)),
    "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=8, num_key_value_heads=2, intermediate_size=160, **TOKENS)), None, (8, 2)),
    "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=8, num_key_value_heads=4, intermediate_size=160, **TOKENS)), None, (8, 4)),
    "mixtral": (lambda: T.MixtralForCausalLM(T.MixtralConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, **TOKENS)), None, (4, 2)),
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(n_layer=3, hidden_size=64, n_head=4, **TOKENS)), None, (4, 4)),
    "opt": (lambda: T.OPTForCausalLM(T.OPTConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, ffn_dim=256, word_embed_proj_dim=64, max_position_embeddings=128, **TOKENS)), None, (4, 4)),
    "gpt_neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=256, **TOKENS)), None, (4, 4)),
    "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(num_layers=3, num_decoder_layers=3, d_model=64, d_kv=16, num_heads=4, d_ff=256, **TOKENS)), _seq2seq, (4, 4)),
    "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=256, image_size=32, patch_size=8)), lambda b, s: torch.zeros(b, 3, 32, 32), (4, 4)),
    "resnet50": (lambda: T.ResNetForImageClassification(T.ResNetConfig()), lambda b, s: torch.zeros(b, 3, 64, 64), None),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    build, inputs, heads = CASES[request.param]
    model = load_model(model_file(request.param, build, inputs=inputs))
    return request.param, build, model, heads


def test_traces_with_real_parameter_count_and_attention(case):
    name, build, model, heads = case
    graph = model.trace(32)
    assert graph.num_params == sum(p.numel() for p in build().parameters())
    if heads is None:
        assert graph.dims is None and len(graph.layers) > 4  # split into a chain to cut
        return
    blocks = [graph.layers[i] for i in graph.block_indices()]
    assert blocks and all(b.attention for b in blocks)
    assert (graph.dims.num_heads, graph.dims.num_kv_heads) == heads
    splits = [g.split for g in blocks[-1].gemms]
    assert splits.count(TpSplit.ROW) >= 2 and TpSplit.COLUMN in splits


def test_solve_returns_a_plan(case):
    name, _, model, _ = case
    result = autoplan.solve(model, CLUSTER, seq_len=32, global_batch=8, time_limit_s=20)
    # A tiny model may not gain from all 8 GPUs: plans can use fewer.
    assert result.plan.world_size <= 8 and result.estimate.feasible


def test_t5_keeps_encoder_then_decoder():
    build, inputs, _ = CASES["t5"]
    graph = load_model(model_file("t5", build, inputs=inputs)).trace(32)
    names = [l.name for l in graph.layers if l.kind is LayerKind.BLOCK]
    assert names == [f"encoder.block.{i}" for i in range(3)] + [f"decoder.block.{i}" for i in range(3)]


def test_mixtral_experts_recorded_and_router_not_split():
    build, _, _ = CASES["mixtral"]
    s = 32
    block = next(l for l in load_model(model_file("mixtral", build)).trace(s).layers
                 if l.kind is LayerKind.BLOCK)
    (experts,) = block.experts
    assert (experts.num_experts, experts.top_k) == (4, 2)
    assert experts.params_per_expert == 3 * 64 * 128  # gate, up and down of one SwiGLU expert
    assert experts.tokens_per_expert == s * 2 / 4
    router = next(g for g in block.gemms if g.name == experts.router)
    assert router.split is TpSplit.NONE and router.out_features == 4
    # Expert FLOPs are those of top_k experts per token: 3 matmuls of h x f on s * k rows.
    expert_flops = sum(g.fwd_flops for g in block.gemms if g.name.startswith(experts.name))
    assert expert_flops == 3 * 2 * (s * 2) * 64 * 128


def test_explicit_attention_is_recorded_as_causal_attention():
    """BLOOM computes attention as baddbmm -> softmax -> bmm with ALiBi and a causal mask."""
    build, _, _ = CASES["bloom"]
    block = load_model(model_file("bloom", build)).trace(32).layers[1]
    (attention,) = block.attention
    assert (attention.num_heads, attention.head_dim, attention.seq_len) == (4, 16, 32)
    assert attention.causal
    assert attention.fwd_flops == 4 * 32 * 32 * 64
