"""Memory DeepSpeed allocates beyond the model states: the fp64 copy its ZeRO-1/2 optimizer
makes of each gradient for the norm at the step, and the stage outputs its PipelineEngine keeps
until each micro-batch's backward. Expected values are hand counts from DeepSpeed's source."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import autoplan
from autoplan.api import _training, load_cluster, load_model, make_problem, plan_from_pins
from autoplan.costmodels.step import peak_moments
from autoplan.training import Pins
from autoplan.verify.memory import PeakMemory
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.graph.models import model_file

SEQ, BATCH = 64, 8
WIDE_VOCAB = LlamaConfig(num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2,
                         ffn_hidden_size=176, vocab_size=8192)
wide_vocab = model_file("wide_vocab", lambda: Llama(WIDE_VOCAB), loss=next_token_loss)
"""An embedding (8192 x 64) larger than a block, so it is the largest gradient."""


def _estimate(examples, pins, cluster="dgx-a100-x1.yaml", seq=SEQ, **settings):
    return autoplan.estimate(wide_vocab, examples / "clusters" / cluster, pins,
                             seq_len=seq, global_batch=BATCH, runtime="deepspeed",
                             runtime_settings=settings or None).estimate


def test_zero1_step_copies_the_largest_gradient_piece_in_fp64(examples):
    """stage_1_and_2.get_grad_norm_direct takes ``g.data.to(torch.double)`` of each gradient
    of the rank's partition, one at a time: on one GPU, 16 tokens, full recompute, that copy of
    the 8192 x 64 embedding gradient (8 bytes each) outweighs the backward's activations (plus
    the allocator's 10% slack on them), and the step moment sets the peak."""
    pins = {"dp": 1, "zero": 1, "mbs": 1, "recompute": "full"}
    with_copy = _estimate(examples, pins, cluster="a100-x1.yaml", seq=16)
    without = _estimate(examples, pins, cluster="a100-x1.yaml", seq=16, grad_norm_bytes=0)
    copy = 8 * 8192 * 64
    activations = without.memory_breakdown_gib["activations"] * 2**30
    expected = max(0.0, copy - 1.10 * activations)
    assert expected > 0  # the case is one where the step moment matters
    assert (with_copy.peak_memory_gib - without.peak_memory_gib) * 2**30 == pytest.approx(expected)


def test_zero1_step_copy_hides_under_larger_activations(examples):
    """With mbs 8 and no recompute the backward moment holds more than the fp64 copy: the
    peak does not change."""
    pins = {"dp": 1, "zero": 1, "mbs": 8, "recompute": "none"}
    with_copy = _estimate(examples, pins, cluster="a100-x1.yaml")
    without = _estimate(examples, pins, cluster="a100-x1.yaml", grad_norm_bytes=0)
    assert 8 * 8192 * 64 < without.memory_breakdown_gib["activations"] * 2**30
    assert with_copy.peak_memory_gib == without.peak_memory_gib


def test_pipeline_engine_keeps_each_in_flight_stage_output(examples):
    """PipelineEngine stores each forward's output in pipe_buffers['outputs'] and frees it after
    that micro-batch's backward: the first of 2 stages holds 2 micro-batches in flight (of
    8 / (dp 4 x mbs 1) = 2), each with its output, a [1, s, h] bf16 tensor: 2 x 64 x 64 x 2
    bytes more."""
    pins = {"pp": 2, "dp": 4, "zero": 1, "mbs": 1, "recompute": "full"}
    kept = _estimate(examples, pins, grad_norm_bytes=0)  # the backward moment sets the peak
    freed = _estimate(examples, pins, grad_norm_bytes=0, pp_holds_stage_outputs=False)
    extra = (kept.stage_memory_gib[0] - freed.stage_memory_gib[0]) * 2**30
    outputs = 2 * 1 * SEQ * 64 * 2  # in flight x mbs x s x h x bf16
    assert extra == pytest.approx(outputs * 1.10)  # with the allocator's slack on activations


def test_explain_names_the_step_moment(examples):
    """When the fp64 copy sets the peak (the first case above), explain says the optimizer step
    is the moment, not a backward."""
    cluster = load_cluster(examples / "clusters" / "a100-x1.yaml")
    problem = make_problem(load_model(wide_vocab), cluster,
                           _training(16, BATCH, "bf16", "deepspeed", "flash"))
    plan = plan_from_pins(problem, Pins(dp=1, zero=1, mbs=1, recompute="full"))
    assert peak_moments(problem, plan)[0].startswith("the optimizer step")


def test_the_norm_copy_is_8_bytes_per_element_on_real_torch():
    """DeepSpeed's own norm expression on a 4096 x 64 bf16 gradient, measured on CPU: the peak of
    live tensor bytes is the fp64 copy, 8 bytes per element (the norm itself: one scalar)."""
    import torch
    from deepspeed.runtime.zero.utils import get_norm_dtype

    g = torch.randn(4096, 64, dtype=torch.bfloat16)
    with PeakMemory(SimpleNamespace(stages=())) as measured:
        torch.linalg.vector_norm(g.data.to(get_norm_dtype()).detach(), ord=2.0)
    assert get_norm_dtype() is torch.double
    assert measured.peak_bytes == pytest.approx(8 * 4096 * 64, rel=0.01)
