"""Tracer figures against numbers taken from outside it: closed-form FLOPs, parameter counts of
the real model built on CPU, and the bytes a real CPU training step saves for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autoplan.api import load_model
from autoplan.graph.layer_graph import LayerKind, TpSplit
from autoplan.zoo import GPT, Llama, next_token_loss
from tests.graph.models import GPT_SMALL, LLAMA_GQA, gpt_small, llama_gqa


def _block(graph):
    return graph.layers[graph.block_indices()[0]]


@pytest.mark.parametrize("seq_len", [32, 128])
def test_gpt_block_flops_match_closed_form(seq_len):
    """Forward 24 s h^2 + 4 s^2 h per sample (Narayanan et al. 2021, eq. 2 without the head);
    backward: twice the Linears' FLOPs, 2.5x the attention's (the flash backward's five
    matmuls against two forward, as FlopCounterMode counts them)."""
    s, h = seq_len, GPT_SMALL.hidden_size
    block = _block(load_model(gpt_small).trace(seq_len, "fp32"))
    linears, attention = 24 * s * h * h, 4 * s * s * h
    assert block.fwd_flops == linears + attention
    assert block.bwd_flops == 2 * linears + 2.5 * attention


def test_llama_gqa_swiglu_block_flops_match_hand_count():
    """GQA: K and V project to kv_heads * head_dim = 64 * 2 / 8 = 16 features; SwiGLU: three
    h x f Linears. Attention itself is 4 s^2 h whatever the KV heads (K/V are repeated)."""
    s, h, f = 64, LLAMA_GQA.hidden_size, LLAMA_GQA.ffn_hidden_size
    kv = h * LLAMA_GQA.num_kv_heads // LLAMA_GQA.num_heads
    block = _block(load_model(llama_gqa).trace(s, "fp32"))
    q_o = 2 * (2 * s * h * h)
    k_v = 2 * (2 * s * h * kv)
    mlp = 3 * (2 * s * h * f)
    attention = 4 * s * s * h
    assert block.fwd_flops == q_o + k_v + mlp + attention
    assert {a.num_kv_heads for a in block.attention} == {LLAMA_GQA.num_kv_heads}


def test_flops_scale_with_seq_len_as_closed_form():
    """The trace is at the requested length: whole-model forward FLOPs at two lengths differ by
    exactly what 24 s h^2 L + 4 s^2 h L + 2 s h V (the head) predicts."""
    h, L, V = GPT_SMALL.hidden_size, GPT_SMALL.num_layers, GPT_SMALL.vocab_size
    model = load_model(gpt_small)
    closed = lambda s: L * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * V
    a, b = model.trace(32, "fp32"), model.trace(96, "fp32")
    matmul = lambda g: sum(l.fwd_flops for l in g.layers if l.kind is not LayerKind.LOSS)
    assert matmul(b) - matmul(a) == closed(96) - closed(32)


@pytest.mark.parametrize("module, build", [(gpt_small, lambda: GPT(GPT_SMALL)),
                                           (llama_gqa, lambda: Llama(LLAMA_GQA))])
def test_params_equal_real_model(module, build):
    """Tied weights (GPT's head shares the embedding table) are counted once, like
    sum(p.numel()) over model.parameters(), which yields each Parameter once."""
    real = sum(p.numel() for p in build().parameters())
    graph = load_model(module).trace(32)
    assert graph.num_params == real


def test_tied_head_is_recorded_as_tied():
    graph = load_model(gpt_small).trace(32)
    head = next(l for l in graph.layers if l.kind is LayerKind.HEAD)
    assert head.num_params == 0 and head.tied_params == GPT_SMALL.vocab_size * GPT_SMALL.hidden_size


class _FlashOnCpu(TorchFunctionMode):
    """Run SDPA as the CPU flash kernel, which saves what the CUDA flash kernel saves (output
    and log-sum-exp, no s x s matrix). The tracer runs attention as the flash kernel; CPU SDPA's
    default math path would save the s x s probabilities and the comparison would be unfair."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, kwargs.get("is_causal", False))[0]
        return func(*args, **kwargs)


def _real_saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes saved for backward in a real CPU step, each storage once, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _FlashOnCpu():
        loss = next_token_loss(model(tokens), tokens)
    loss.backward()
    return sum(seen.values())


# The CUDA flash kernel (whose meta kernel the tracer runs) also saves its dropout RNG state,
# a philox seed and offset (uint64[2] and uint64[]), which the CPU flash kernel does not.
PHILOX_STATE_BYTES = 24


@pytest.mark.parametrize("module, build", [(gpt_small, lambda: GPT(GPT_SMALL)),
                                           (llama_gqa, lambda: Llama(LLAMA_GQA))])
def test_saved_bytes_equal_real_cpu_step(module, build):
    seq_len = 64
    torch.manual_seed(0)
    real = _real_saved_bytes(build(), torch.randint(0, 256, (1, seq_len)))
    graph = load_model(module).trace(seq_len, "fp32")
    traced = sum(l.activation_bytes + l.attention_internal_bytes for l in graph.layers)
    calls = sum(len(l.attention) for l in graph.layers)
    assert traced == real + PHILOX_STATE_BYTES * calls


def test_gpt_tp_plan_pairs_columns_and_rows():
    block = _block(load_model(gpt_small).trace(32))
    splits = {g.name.split(".", 2)[-1]: g.split for g in block.gemms}
    assert splits == {"attn.c_attn": TpSplit.COLUMN, "attn.c_proj": TpSplit.ROW,
                      "mlp.c_fc": TpSplit.COLUMN, "mlp.c_proj": TpSplit.ROW}
    assert block.tp_allreduces == 2
