"""Memory DeepSpeed allocates beyond the model states: the fp64 copy its ZeRO-1/2 optimizer
makes of each gradient for the norm at the step, and the stage outputs its PipelineEngine keeps
until each micro-batch's backward. Expected values are hand counts from DeepSpeed's source."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import autoplan
from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
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
    of the rank's partition, one at a time: on one GPU, 16 tokens, full recompute, the copy of
    the 8192 x 64 embedding gradient is 8 x 8192 x 64 = 4 MiB, a large-pool request under
    10 MiB (kLargeBuffer: a 20 MiB segment). Every request of the backward is under 1 MiB
    (16 x 8192 fp32 logits: 512 KiB), so only small-pool blocks are cached and none can
    serve it: the step adds a 20 MiB segment, and the flat copy of the gradients after it
    (2 x 1,136,960 bytes) reuses that segment. Without either copy nothing is added."""
    pins = {"dp": 1, "zero": 1, "mbs": 1, "recompute": "full"}
    with_copy = _estimate(examples, pins, cluster="a100-x1.yaml", seq=16)
    without = _estimate(examples, pins, cluster="a100-x1.yaml", seq=16, grad_norm_bytes=0,
                        step_flattens_grads=False)
    added = (with_copy.peak_memory_gib - without.peak_memory_gib) * 2**30
    assert added == pytest.approx(20 * 2**20)


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
    # the backward moment sets the peak (not the step's copies nor the gradient accumulation)
    kept = _estimate(examples, pins, grad_norm_bytes=0, accumulates_into_grad=False)
    freed = _estimate(examples, pins, grad_norm_bytes=0, accumulates_into_grad=False,
                      pp_holds_stage_outputs=False)
    extra = (kept.stage_memory_gib[0] - freed.stage_memory_gib[0]) * 2**30
    outputs = 2 * 1 * SEQ * 64 * 2  # in flight x mbs x s x h x bf16
    assert extra == pytest.approx(outputs * 1.10)  # with the allocator's slack on activations


def test_explain_names_the_step_moment(examples):
    """When the fp64 copy sets the peak (the first case above), explain says the optimizer step
    is the moment, not a backward."""
    cluster = load_cluster(examples / "clusters" / "a100-x1.yaml")
    problem = make_problem(load_model(wide_vocab), cluster,
                           training_spec(16, BATCH, "bf16", "deepspeed", "flash"))
    plan = plan_from_pins(problem, Pins(dp=1, zero=1, mbs=1, recompute="full"))
    assert peak_moments(problem, plan)[0].startswith("the gradient reduction and optimizer step")


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


def test_last_stage_buffer_count_is_deepspeeds():
    """The two output slots the memory model keeps on the last stage are DeepSpeed's own
    ``TrainSchedule.num_pipe_buffers`` there, however many micro-batches run."""
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    from autoplan.costmodels.memory import LAST_STAGE_PIPE_BUFFERS, last_stage_output_slots

    for m in (1, 2, 8):
        buffers = TrainSchedule(micro_batches=m, stages=4, stage_id=3).num_pipe_buffers()
        assert buffers == LAST_STAGE_PIPE_BUFFERS
        assert last_stage_output_slots(m) == min(buffers, m)


def test_last_stage_keeps_the_previous_micro_batchs_fp32_logits(examples):
    """The last stage never clears pipe_buffers['outputs'] (_exec_backward_pass returns after
    the loss's backward), so with 2 micro-batches (8 sequences / dp 4) it holds the other
    buffer's fp32 logits besides the in-flight one: with 1 micro-batch (4 sequences) there is
    no other buffer. Hand count: mbs 1 x 64 tokens x 8192 logits x 4 bytes, with the
    allocator's 10% slack on activations; nothing else on that stage depends on the count."""
    pins = {"pp": 2, "dp": 4, "zero": 1, "mbs": 1, "recompute": "full"}
    two = _estimate(examples, pins, grad_norm_bytes=0)
    one = autoplan.estimate(wide_vocab, examples / "clusters" / "dgx-a100-x1.yaml", pins,
                            seq_len=SEQ, global_batch=4, runtime="deepspeed",
                            runtime_settings={"grad_norm_bytes": 0}).estimate
    extra = (two.stage_memory_gib[1] - one.stage_memory_gib[1]) * 2**30
    assert extra == pytest.approx(1 * SEQ * 8192 * 4 * 1.10)


def test_bf16_optimizer_upcast_of_the_largest_gradient(examples):
    """BF16_Optimizer.update_hp_grads adds each bf16 gradient into its fp32 one through
    ``lp.grad.data.to(fp32)``: on one GPU with one micro-batch in flight, once its activations
    are freed, the 4-byte copy of the largest gradient (the 8192 x 64 embedding or head) is the
    transient, here larger than the backward's in-flight activations and transient: the peak
    rises by the difference, with the allocator's 10% slack on activations. The older fp32
    logits the engine keeps in its other output buffer (4 tokens x 8192 x 4 bytes; 8
    micro-batches run) stay at both moments."""
    pins = {"dp": 1, "zero": 1, "mbs": 1, "recompute": "full"}
    settings = {"grad_norm_bytes": 0, "step_flattens_grads": False}
    plain = _estimate(examples, pins, cluster="a100-x1.yaml", seq=4, **settings)
    upcast = _estimate(examples, pins, cluster="a100-x1.yaml", seq=4, grad_upcast_bytes=4,
                       **settings)
    kept_logits = 4 * 8192 * 4
    backward = plain.memory_breakdown_gib["activations"] * 2**30 - kept_logits
    copy = 4 * 8192 * 64
    assert copy > backward  # the case is one where the upcast moment matters
    extra = (upcast.peak_memory_gib - plain.peak_memory_gib) * 2**30
    assert extra == pytest.approx((copy - backward) * 1.10)


def test_the_upcast_is_4_bytes_per_element_on_real_torch():
    """BF16_Optimizer's own accumulation expression on a 4096 x 64 bf16 gradient, measured on
    CPU: the only new tensor is the fp32 copy, 4 bytes per element."""
    import torch

    lp_grad = torch.randn(4096, 64, dtype=torch.bfloat16)
    hp_grad = torch.zeros(4096 * 64, dtype=torch.float32)
    with PeakMemory(SimpleNamespace(stages=())) as measured:
        hp_grad.data.add_(lp_grad.data.to(hp_grad.dtype).view(hp_grad.shape))
    assert measured.peak_bytes == pytest.approx(4 * 4096 * 64, rel=0.01)


def test_zero1_step_flat_copy_at_dp1(examples):
    """stage_1_and_2.step flattens the partition's 16-bit gradients (``self.flatten``) before the
    fp32 cast; at dp 1 the partition is every gradient, so the step holds a second copy: 2
    bytes x 1,136,960 parameters (embedding 8192 x 64, head 8192 x 64, two blocks of 44,160 and
    the final norm's 64) = 2.2 MB, a large-pool request under 10 MiB: a new 20 MiB segment
    (kLargeBuffer), as the backward at 4 tokens cached only small-pool blocks. At dp 2 the
    gradients freed outside the partition cover the copy."""
    pins = {"dp": 1, "zero": 1, "mbs": 1, "recompute": "full"}
    flat = _estimate(examples, pins, cluster="a100-x1.yaml", seq=4, grad_norm_bytes=0)
    plain = _estimate(examples, pins, cluster="a100-x1.yaml", seq=4, grad_norm_bytes=0,
                      step_flattens_grads=False)
    params = 2 * 8192 * 64 + 2 * (2 * 64 * 64 + 2 * 16 * 64 + 3 * 64 * 176 + 2 * 64) + 64
    assert params == 1_136_960
    assert 2**20 < 2 * params < 10 * 2**20
    assert (flat.peak_memory_gib - plain.peak_memory_gib) * 2**30 == pytest.approx(20 * 2**20)
    pins2 = {"dp": 2, "zero": 1, "mbs": 1, "recompute": "full"}
    on_two = _estimate(examples, pins2, cluster="dgx-a100-x1.yaml", seq=16, grad_norm_bytes=0)
    off_two = _estimate(examples, pins2, cluster="dgx-a100-x1.yaml", seq=16, grad_norm_bytes=0,
                        step_flattens_grads=False)
    assert on_two.peak_memory_gib == off_two.peak_memory_gib


def test_accumulating_a_later_micro_batchs_gradient_copies_it(examples):
    """ZeRO-1 leaves ``param.grad`` in place between micro-batches, so autograd's AccumulateGrad
    adds each later gradient into it: the embedding's 8192 x 64 16-bit gradient (2 bytes each)
    exists beside ``.grad`` after the backward, when the micro-batch's activations are freed;
    here larger than the backward's in-flight activations and transient, so the peak rises by
    the difference (with the allocator's 10% slack). One micro-batch per step (8 sequences at
    mbs 8): its gradient is stolen into ``.grad``, no copy, no change."""
    pins = {"dp": 1, "zero": 1, "mbs": 1, "recompute": "full"}
    settings = {"grad_norm_bytes": 0, "step_flattens_grads": False}
    plain = _estimate(examples, pins, cluster="a100-x1.yaml", seq=2,
                      accumulates_into_grad=False, **settings)
    copied = _estimate(examples, pins, cluster="a100-x1.yaml", seq=2, **settings)
    kept_logits = 2 * 8192 * 4  # the engine's other output buffer (8 micro-batches)
    backward = plain.memory_breakdown_gib["activations"] * 2**30 - kept_logits
    copy = 2 * 8192 * 64
    assert copy > backward
    extra = (copied.peak_memory_gib - plain.peak_memory_gib) * 2**30
    assert extra == pytest.approx((copy - backward) * 1.10)
    once = {"dp": 1, "zero": 1, "mbs": 8, "recompute": "full"}
    assert (_estimate(examples, once, cluster="a100-x1.yaml", seq=2, **settings).peak_memory_gib
            == _estimate(examples, once, cluster="a100-x1.yaml", seq=2,
                         accumulates_into_grad=False, **settings).peak_memory_gib)
