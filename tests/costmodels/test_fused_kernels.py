"""Megatron's fused element-wise kernels: each kernel's bytes worked by hand from what the
framework's code reads and writes (megatron-core 0.16.1 and Transformer Engine, see
costmodels/fused_kernels.py), and the plan priced with them exported as that implementation."""

from __future__ import annotations


import pytest

from autoplan.costmodels.fused_kernels import block_kernels, block_traffic
from autoplan.costmodels.profiles import runtime_profile
from autoplan.errors import ConstraintError
from autoplan.graph.layer_graph import LayerKind, ModelDims
from autoplan.plugins.megatron import megatron_args
from autoplan.problems import runtime_with
from tests.plugins.plans import changed, load_plan

LLAMA31_8B = ModelDims(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                       ffn_hidden_size=14336, vocab_size=128256, seq_len=8192, gated_mlp=True,
                       rmsnorm=True, rotary=True, linear_bias=False)
GPT3_175B = ModelDims(hidden_size=12288, num_layers=96, num_heads=96, num_kv_heads=96,
                      ffn_hidden_size=49152, vocab_size=51200, seq_len=2048)


def _sums(kernels) -> tuple[float, float, float, float]:
    """(forward sharded, forward replicated, backward sharded, backward replicated) bytes."""
    return (sum(k.fwd_bytes for k in kernels if k.sharded),
            sum(k.fwd_bytes for k in kernels if not k.sharded),
            sum(k.bwd_bytes for k in kernels if k.sharded),
            sum(k.bwd_bytes for k in kernels if not k.sharded))


def test_transformer_engine_llama_block_bytes_per_token_by_hand():
    kernels = block_kernels("transformer_engine", LLAMA31_8B, head_dim=128, dropout=0.0, b=2)
    # h = 4096, F = 14336, q + k = (32 + 8) * 128 = 5120 elements, bf16
    # sharded: fused RoPE 2 * 5120 * 2 = 20480; SwiGLU reads 2F writes F: 3 * 14336 * 2 = 86016
    # replicated: 2 RMSNorms (read h, write h, fp32 rsigma) 2 * (2 * 4096 * 2 + 4) = 32776;
    #   2 residual adds, no bias, no dropout (read x and residual, write out) 2 * 3 * 4096 * 2
    #   = 49152
    # backward: RoPE 20480; swiglu_back reads dy (F) and y (2F), writes dy (2F) 5 * 14336 * 2
    #   = 143360; norms read x and dy, write dx: 2 * (3 * 4096 * 2 + 4) = 49160; the adds
    #   pass dy through (0)
    assert _sums(kernels) == (106496, 81928, 163840, 49160)


def test_megatron_2021_gpt_block_bytes_per_token_by_hand():
    kernels = block_kernels("local", GPT3_175B, head_dim=128, dropout=0.1, b=2)
    h, f = 12288, 49152
    # sharded: context permute copy (read + write 96 * 128) 2 * h * 2; bias-GeLU 2 * f * 2
    # replicated: 2 LayerNorms (2 h * 2 + mu, rsigma fp32 8); 2 bias-dropout-adds
    #   (read x, residual, write out: 3 h * 2, and a 1-byte mask per element h)
    # backward: permute 0, bias_gelu_back 3 f * 2 and fc1's bias gradient reads it f * 2;
    #   LayerNorm 3 h * 2 + 8; bias-dropout-add reads dy and mask, writes dx (2 h * 2 + h)
    #   and the bias gradient reads dy (h * 2)
    assert _sums(kernels) == (4 * h + 4 * f, 2 * (4 * h + 8) + 2 * (7 * h),
                              8 * f, 2 * (6 * h + 8) + 2 * (7 * h))
    assert not any("RoPE" in k.name for k in kernels)  # learned positions, in the embedding


def test_eager_rope_moves_six_times_the_fused_kernel():
    te = block_kernels("transformer_engine", LLAMA31_8B, 128, 0.0, 2)
    local = block_kernels("local", LLAMA31_8B, 128, 0.0, 2)
    rope = {k.name: k.fwd_bytes for k in te + local if "RoPE" in k.name}
    # eager: mul 2 + neg 1 + cat 2 + mul 2 + add 3 + cat 2 = 12 moves per element, fused 2
    assert rope == {"fused RoPE (TE)": 2 * 5120 * 2, "RoPE (eager torch ops)": 12 * 5120 * 2}


def test_block_traffic_is_the_table_times_the_tokens_and_less_than_eager(llama_graph):
    block = next(l for l in llama_graph.layers if l.kind is LayerKind.BLOCK)
    traffic = block_traffic(llama_graph, block, "transformer_engine", "bf16")
    # h 256, F 896, q + k = (8 + 2) * 32 = 320; 64 tokens: sharded 2*320*2 + 3*896*2 = 6656,
    # replicated 2 * (2*256*2 + 4) + 2 * 3*256*2 = 2056 + 3072 = 5128
    assert (traffic.fwd_sharded, traffic.fwd_replicated) == (64 * 6656, 64 * 5128)
    eager = block.elementwise_bytes_sharded + block.elementwise_bytes_replicated
    assert traffic.fwd_sharded + traffic.fwd_replicated < eager  # fp32 upcasts, one op a kernel
    head = next(l for l in llama_graph.layers if l.kind is LayerKind.HEAD)
    assert block_traffic(llama_graph, head, "transformer_engine", "bf16") is None
    assert block_traffic(llama_graph, block, None, "bf16") is None


def test_runtimes_name_their_implementation_and_unknown_ones_are_refused():
    assert runtime_profile("megatron").transformer_impl == "transformer_engine"
    assert runtime_profile("deepspeed").transformer_impl is None  # eager, the traced kernels
    with pytest.raises(ConstraintError, match="transformer_impl"):
        runtime_with(runtime_profile("megatron"), {"transformer_impl": "apex"})


@pytest.mark.parametrize("impl", ["transformer_engine", "local"])
def test_megatron_export_launches_the_implementation_it_was_priced_with(impl):
    result = load_plan("llama8b_3d_vpp_sp")
    training = {**result.training.model_dump(mode="json"), "transformer_impl": impl}
    result = changed(result, training=training)
    args = megatron_args(result)
    assert args[args.index("--transformer-impl") + 1] == impl
