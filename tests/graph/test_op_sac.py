"""What torchtitan's selective (op-level) activation checkpointing saves of a block, as the
tracer predicts it, against real torch on CPU running torchtitan's own policy
(``SelectiveAC._wrap_block``: ``create_selective_checkpoint_contexts`` with its save list and
every-second-mm rule), whose cache we read after each forward."""

from __future__ import annotations

import pytest
import torch

from autoplan.api import load_model
from autoplan.zoo import Llama
from tests.graph.models import LLAMA_GQA, llama_gqa

ac = pytest.importorskip("torchtitan.distributed.activation_checkpoint")

SEQ = 64


class _CpuSelectiveAC(ac.SelectiveAC):
    """torchtitan's policy with the CPU twin of the CUDA flash-attention kernel it saves
    (``_scaled_dot_product_flash_attention``: on CPU SDPA runs ``..._for_cpu``, which
    returns the same output and log-sum-exp)."""

    def get_save_ops(self) -> set:
        return super().get_save_ops() | {
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def _cache_bytes(contexts) -> float:
    """Bytes in the SAC cache of one checkpointed forward, each storage once."""
    storages = {}
    for calls in contexts[0].storage.values():  # op -> call index -> its cached outputs
        for tree in calls.values():
            for leaf in torch.utils._pytree.tree_leaves(tree):
                t = getattr(leaf, "val", None)  # _VersionWrapper; _RECOMPUTE has none
                if isinstance(t, torch.Tensor):
                    storages[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return float(sum(storages.values()))


def test_traced_op_sac_bytes_equal_torchtitans_cache_on_cpu(monkeypatch):
    """Seven bias-free Linears per block (wq wk wv wo w1 w3 w2): every forward (the policy's
    mm count starts afresh per checkpointed call) saves the 1st, 3rd, 5th and 7th mm outputs,
    and the attention output with its fp32 log-sum-exp."""
    measured = []
    made = []
    real = ac.create_selective_checkpoint_contexts

    def recording(policy):
        contexts = real(policy)
        made.append(contexts)
        return contexts

    monkeypatch.setattr(ac, "create_selective_checkpoint_contexts", recording)
    torch.manual_seed(0)
    block = Llama(LLAMA_GQA).layers[0].to(torch.bfloat16)
    wrapped = _CpuSelectiveAC(_CpuSelectiveAC.Config())._wrap_block(block)
    for _ in range(2):
        x = torch.randn(1, SEQ, LLAMA_GQA.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        out = wrapped(x)
        measured.append(_cache_bytes(made[-1]))
        out.sum().backward()
    graph = load_model(llama_gqa).trace(SEQ, "bf16")
    traced = graph.layers[graph.block_indices()[0]].op_sac_bytes
    assert measured == [traced.sharded + traced.partial] * 2


def test_row_parallel_outputs_are_the_partial_part():
    """Hand count in bf16 bytes per sample: the saved mm outputs are wq (s x h), wv (s x kv),
    w1 (s x f) and the row-parallel w2 (s x h, the partial part); attention adds its output
    (s x h) and the fp32 log-sum-exp (heads x s x 4)."""
    s, h, f = SEQ, LLAMA_GQA.hidden_size, LLAMA_GQA.ffn_hidden_size
    kv = h * LLAMA_GQA.num_kv_heads // LLAMA_GQA.num_heads
    graph = load_model(llama_gqa).trace(SEQ, "bf16")
    saved = graph.layers[graph.block_indices()[0]].op_sac_bytes
    assert saved.partial == 2 * s * h
    assert saved.sharded == 2 * s * (h + kv + f) + 2 * s * h + 4 * LLAMA_GQA.num_heads * s
