"""Frozen parameters in the trace: what trains, and what backward computes, against a real
forward/backward of the same model on CPU under FlopCounterMode with the same parameters
frozen (every block run for real, nothing replayed)."""

import types

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autoplan.errors import ModelFileError
from autoplan.graph.layer_graph import LayerKind
from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model

transformers = pytest.importorskip("transformers")

SEQ = 32
LAYERS = 4


def _llama(trained_blocks, *, norms_train=True, layers=LAYERS):
    """A tiny HF Llama (eager attention: its matmuls count the same on meta and CPU) with only
    the given blocks trainable."""
    config = transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, vocab_size=256, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config)
    for name, p in model.named_parameters():
        block = any(f"layers.{i}." in name for i in trained_blocks)
        p.requires_grad = block and (norms_train or "norm" not in name)
    return model


def _source(trained_blocks, **kw):
    module = types.ModuleType(f"frozen_{'_'.join(map(str, trained_blocks))}")
    module.build_model = lambda: _llama(trained_blocks, **kw)
    return load_model_source(module)


def _real_backward_flops(trained_blocks, **kw) -> dict[str, float]:
    """Backward FLOPs per block of the real model on CPU, batch 1, loss = mean of the logits
    in fp32 (what the trace uses without a loss())."""
    torch.manual_seed(0)
    model = _llama(trained_blocks, **kw).to(torch.bfloat16)
    ids = torch.randint(0, 256, (1, SEQ))
    with FlopCounterMode(display=False) as counter:
        loss = model(ids).logits.float().mean()
        fwd = {k: float(sum(v.values())) for k, v in counter.get_flop_counts().items()}
        loss.backward()
    total = {k: float(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    root = type(model).__name__
    return {f"model.layers.{i}": total.get(f"{root}.model.layers.{i}", 0.0)
            - fwd.get(f"{root}.model.layers.{i}", 0.0) for i in range(kw.get("layers", LAYERS))}


@pytest.mark.parametrize("trained", [(3,), (0,), (2, 3), (1,)])
def test_backward_flops_per_block_match_a_real_backward(trained):
    graph = trace_model(_source(trained), seq_len=SEQ)
    blocks = {l.name: l.bwd_flops for l in graph.layers if l.kind is LayerKind.BLOCK}
    real = _real_backward_flops(trained)
    assert blocks == pytest.approx(real, rel=1e-9)
    first = min(trained)  # blocks before it run no backward, the rest do
    assert [real[f"model.layers.{i}"] > 0 for i in range(LAYERS)] == [i >= first
                                                                       for i in range(LAYERS)]


def test_blocks_before_the_first_trainable_one_have_no_backward_and_save_nothing():
    graph = trace_model(_source((2, 3)), seq_len=SEQ)
    blocks = [l for l in graph.layers if l.kind is LayerKind.BLOCK]
    assert [b.in_backward for b in blocks] == [False, False, True, True]
    assert [b.activation_bytes == 0 for b in blocks] == [True, True, False, False]
    embedding = graph.layers[0]
    assert not embedding.in_backward and embedding.frozen_params == embedding.num_params


def test_frozen_blocks_after_a_trainable_one_compute_input_gradients_only():
    graph = trace_model(_source((0,)), seq_len=SEQ)
    frozen = [l for l in graph.layers if l.kind is LayerKind.BLOCK][1:]
    assert all(g.dgrad and not g.wgrad for b in frozen for g in b.gemms)
    head = next(l for l in graph.layers if l.kind is LayerKind.HEAD)
    assert all(not g.wgrad for g in head.gemms)


def test_trainable_count_equals_torchs():
    for trained in [(3,), (0, 1), (0, 1, 2, 3)]:
        graph = trace_model(_source(trained), seq_len=SEQ)
        model = _llama(trained)
        assert graph.num_trainable_params == sum(p.numel() for p in model.parameters()
                                                 if p.requires_grad)
        assert graph.num_params == sum(p.numel() for p in model.parameters())


def test_a_model_with_nothing_to_train_is_a_clear_error():
    with pytest.raises(ModelFileError, match="no parameter requires grad"):
        trace_model(_source(()), seq_len=SEQ)
