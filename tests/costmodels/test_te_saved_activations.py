"""What a block saves for backward under megatron-core with Transformer Engine: the bytes per
token worked by hand from megatron-core 0.16.1's modules (costmodels/saved_activations.py),
the pieces TE does not own checked against megatron-core's own fusions run on CPU, and the
split by TP / SP and recompute."""

from __future__ import annotations

import types
import warnings

import torch

from autoplan.costmodels.compute import Split
from autoplan.costmodels.memory import layer_activation_bytes
from autoplan.costmodels.saved_activations import megatron_saved_layer, te_block_saved
from autoplan.graph.layer_graph import Attention, LayerKind, ModelDims
from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
from autoplan.plan import Recompute
from autoplan.zoo import GPT, GPTConfig, next_token_loss

LLAMA3_8B = ModelDims(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=128256, seq_len=8192, gated_mlp=True,
                      rmsnorm=True, rotary=True, linear_bias=False)
GPT_1B = ModelDims(hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=16,
                   ffn_hidden_size=4096, vocab_size=50304, seq_len=2048)


def _attention(dims: ModelDims, dropout: float) -> Attention:
    return Attention(num_heads=dims.num_heads, num_kv_heads=dims.num_kv_heads,
                     head_dim=dims.hidden_size // dims.num_heads, seq_len=dims.seq_len,
                     causal=True, dropout=dropout, fwd_flops=0.0, bwd_flops=0.0)


def test_llama_block_saves_34h_plus_statistics_per_token():
    saved = te_block_saved(LLAMA3_8B, _attention(LLAMA3_8B, 0.0), b=2)
    # h 4096, 32 heads x 128, 8 KV heads, F 14336, bf16, RMSNorm, no dropout:
    # hidden width (split by SP): 2 TE LayerNormLinears x (norm input h*2 + ln_out h*2 +
    #   fp32 rsigma 4) = 2 * (16384 + 4) = 32776 (8h + 8)
    # TP-sharded: q (rotated) and the flash output 2 * 4096 * 2 = 16384; k and v
    #   2 * 1024 * 2 = 4096; bias-SwiGLU's input (fc1 output, 2F) 2 * 14336 * 2 = 57344 and
    #   fc2's input (F) 14336 * 2 = 28672: 106496 (26h)
    # attention internal: fp32 log-sum-exp per query head 4 * 32 = 128
    assert (saved.sharded, saved.replicated, saved.attention_internal) == (106496, 32776, 128)


def test_gpt_block_with_dropout_is_korthikantis_34_sbh():
    saved = te_block_saved(GPT_1B, _attention(GPT_1B, 0.1), b=2)
    h = 1024
    # Korthikanti et al. 2022 eq. 1 without the 5as/h score term (flash): 34 h bytes per token.
    # Here: LayerNorms 2 * (2h + 2h + mu and rsigma 8) and two dropout masks 2 * h = 10h + 16;
    # q, k, v, out 4 * 2h = 8h; bias-GeLU's input 4h * 2 and fc2's input 4h * 2 = 16h
    assert saved.replicated == 10 * h + 16
    assert saved.sharded == 24 * h
    assert saved.sharded + saved.replicated - 16 == 34 * h
    assert saved.attention_internal == 4 * 16


def _saved_bytes(fn, *args) -> int:
    """Bytes autograd saves (each storage once) while ``fn`` runs on real torch."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def test_megatron_core_fusions_save_what_the_table_counts_on_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
        from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
    tokens, f = 16, 32
    fc1_out = torch.randn(tokens, 1, 2 * f, dtype=torch.bfloat16, requires_grad=True)
    # bias-SwiGLU keeps its input, the 2F-wide fc1 output, bf16: 16 * 64 * 2
    assert _saved_bytes(lambda x: bias_swiglu_impl(x, None), fc1_out) == tokens * 2 * f * 2
    bias_dropout_add = get_bias_dropout_add(training=True, fused=True)
    x, residual = (torch.randn(tokens, 1, f, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(2))
    # no dropout: nothing kept; with dropout a 1-byte mask per element (MASK_BYTES)
    assert _saved_bytes(lambda t: bias_dropout_add((t, None), residual, 0.0), x) == 0
    assert _saved_bytes(lambda t: bias_dropout_add((t, None), residual, 0.1), x) == tokens * f


def test_traced_block_takes_the_te_set_and_splits_by_tp_sp_and_recompute(llama_graph):
    traced = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    block = megatron_saved_layer(llama_graph, traced, "transformer_engine", "bf16")
    # h 256, 8 heads x 32, 2 KV heads, F 896, 64 tokens: sharded q + out 2 * 256 * 2 = 1024,
    # k + v 2 * 64 * 2 = 256, SwiGLU in 2 * 896 * 2 = 3584 and fc2 in 896 * 2 = 1792: 6656;
    # replicated 2 * (2 * 256 * 2 + 4) = 2056; internal lse 4 * 8 = 32
    assert block.activation_bytes_sharded == 64 * 6656
    assert block.activation_bytes_replicated == 64 * 2056
    assert block.attention_internal_bytes == 64 * 32
    assert block.activation_bytes < traced.activation_bytes  # the eager fp32 upcasts are gone
    split = Split(tp=2, cp=1, sp=True, mbs=2)
    # everything over tp = 2 under SP, two samples: 2 * 64 * (6656 + 2056 + 32) / 2
    assert layer_activation_bytes(block, split, Recompute.NONE) == 64 * (6656 + 2056 + 32)
    # Megatron's selective recompute of core attention drops the log-sum-exp only
    assert layer_activation_bytes(block, split, Recompute.SELECTIVE) == 64 * (6656 + 2056)
    # full recompute keeps the block's input, as traced: 64 tokens x 256 x bf16, over SP
    assert layer_activation_bytes(block, split, Recompute.FULL) == 2 * 64 * 256 * 2 / 2


def test_other_runtimes_and_layers_keep_the_traced_set(llama_graph):
    block = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    head = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.HEAD)
    assert megatron_saved_layer(llama_graph, block, None, "bf16") is block
    assert megatron_saved_layer(llama_graph, block, "local", "bf16") is block
    assert megatron_saved_layer(llama_graph, head, "transformer_engine", "bf16") is head


def test_eager_gpt_block_traced_on_real_torch_saves_the_same_set():
    """A GPT block has nothing TE would save differently (LayerNorm saves its input and
    statistics, GeLU its input, no rotary): torch's own saved tensors, as the trace records
    them, equal the table's count (the flash kernel's RNG state aside)."""
    module = types.ModuleType("te_saved_gpt")
    module.build_model = lambda: GPT(GPTConfig(num_layers=2, hidden_size=1024, num_heads=16,
                                               vocab_size=4096, max_seq_len=256, dropout=0.0))
    module.loss = next_token_loss
    graph = trace_model(load_model_source(module), seq_len=256, precision="bf16")
    traced = next(layer for layer in graph.layers if layer.kind is LayerKind.BLOCK)
    block = megatron_saved_layer(graph, traced, "transformer_engine", "bf16")
    # by hand, 256 tokens: sharded 24h = 24576, replicated 8h + 16 = 8208 (LayerNorm mu, rsigma)
    assert (block.activation_bytes_sharded, block.activation_bytes_replicated) == (
        256 * 24576, 256 * 8208)
    assert (traced.activation_bytes_sharded, traced.activation_bytes_replicated) == (
        block.activation_bytes_sharded, block.activation_bytes_replicated)
