"""Megatron-LM's ``--grad-reduce-in-bf16`` (runtime setting ``grad_reduce_in_bf16``), checked
against megatron-core's own rules worked by hand: ``param_and_grad_buffer.py`` makes the
gradient buffer ``torch.float if grad_reduce_in_fp32 else param.dtype`` (so bf16, 2 bytes per
parameter, reduced in bf16), and the optimizer step copies each parameter's shard of it to
fp32 for the fp32 master weights (``distrib_optimizer.py``: ``shard_model_grad.float()``; the
non-distributed Float16 optimizer copies the whole ``main_grad`` the same way)."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.costmodels.profiles import runtime_profile, with_gradient_dtype

TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
BF16_GRADS = {"grad_reduce_in_bf16": True}
GIB = 2**30


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def _gradients_gib(pins, settings=None, precision="bf16"):
    result = autoplan.estimate(TINY, DGX1, pins, seq_len=256, global_batch=16,
                               runtime="megatron", precision=precision,
                               runtime_settings=settings)
    return result, result.estimate.memory_breakdown_gib["gradients"]


@pytest.mark.parametrize(("zero", "dp", "bytes_per_param"), [
    (1, 8, 2 + 4 / 8),  # bf16 buffer + the fp32 copy of the 1/8 shard the step updates
    (0, 8, 2 + 4),      # without the distributed optimizer every rank copies all of it
])
def test_bf16_gradients_take_two_bytes_and_the_steps_fp32_copy(zero, dp, bytes_per_param):
    pins = {"tp": 1, "pp": 1, "dp": dp, "zero": zero, "mbs": 1}
    plain, fp32 = _gradients_gib(pins)
    priced, bf16 = _gradients_gib(pins, BF16_GRADS)
    params = plain.model.num_params  # tp 1, pp 1: every parameter on every GPU, all trained
    assert fp32 == pytest.approx(4 * params / GIB)  # Megatron-LM's bf16 default: fp32 main grads
    assert bf16 == pytest.approx(bytes_per_param * params / GIB)
    assert priced.training.grad_reduce_in_bf16 and not plain.training.grad_reduce_in_bf16


def test_the_data_parallel_reduction_sends_half_the_bytes():
    # The buckets (megatron-core's parameter counts) are the same; each is reduce-scattered in
    # the buffer's dtype, and the distributed optimizer then all-gathers the updated bf16
    # parameters (2 bytes) as before: (2 + 2) / (4 + 2) of the traffic. A model big enough for
    # bandwidth to dominate each bucket's time, and the collectives after the backward (no
    # overlap), so dp_comm is all of them.
    pins = {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "mbs": 1}
    model = "examples/models/llama2_7b.py"
    times = [autoplan.estimate(model, DGX1, pins, seq_len=256, global_batch=16,
                               runtime="megatron",
                               runtime_settings={"overlap_grad_reduce": False, **extra}
                               ).estimate.time_breakdown_s["dp_comm"]
             for extra in ({}, BF16_GRADS)]
    assert times[1] / times[0] == pytest.approx(4 / 6, rel=0.01)


def test_fp16_training_keeps_its_gradients_as_they_are():
    # Megatron-LM reads --grad-reduce-in-bf16 only under --bf16; fp16 grads are fp16 already.
    pins = {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "mbs": 1}
    plain, fp16 = _gradients_gib(pins, precision="fp16")
    priced, flagged = _gradients_gib(pins, BF16_GRADS, precision="fp16")
    assert flagged == fp16 == pytest.approx(2 * plain.model.num_params / GIB)
    assert not priced.training.grad_reduce_in_bf16
    fp16_profile = runtime_profile("megatron", "fp16")
    assert with_gradient_dtype(fp16_profile) == fp16_profile


def test_runtimes_that_set_their_own_gradient_dtype_refuse_the_setting():
    with pytest.raises(autoplan.AutoplanError, match="--grad-reduce-in-bf16"):
        autoplan.estimate(TINY, DGX1, {"tp": 1, "dp": 8, "zero": 1, "mbs": 1}, seq_len=256,
                          global_batch=16, runtime="deepspeed", runtime_settings=BF16_GRADS)
