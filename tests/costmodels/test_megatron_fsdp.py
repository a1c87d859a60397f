"""ZeRO-2 on the megatron runtime: Megatron-FSDP's ``optim_grads`` as megatron-core 0.16.1's
own code runs it, worked by hand. ``param_and_grad_buffer.py``: under optim_grads the model
weight buffer stays whole, the fp32 main weights and the main gradients are sharded over DP
(the gradients fp32 unless ``grad_reduce_in_fp32`` is off); ``megatron_fsdp.py``: the
gradients are reduce-scattered after every micro-batch's backward (``is_delay_grad_reduce``
only for no_shard/optim), and GradReducePipeline keeps issued buckets queued until more than
``suggested_RS_queue_capacity`` = 1e9 elements are."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.api import load_cluster, load_model
from autoplan.costmodels.memory import reduce_queue_bytes
from autoplan.costmodels.step import peak_moments
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.training import Pins

TINY = "examples/models/tiny_gpt.py"
LLAMA = "examples/models/llama2_7b.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
GIB = 2**30
NO_OVERLAP = {"overlap_grad_reduce": False}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def _estimate(model, zero, *, settings=None, global_batch=16):
    pins = {"tp": 1, "pp": 1, "dp": 8, "zero": zero, "mbs": 1}
    return autoplan.estimate(model, DGX1, pins, seq_len=256, global_batch=global_batch,
                             runtime="megatron", runtime_settings=settings)


@pytest.mark.parametrize(("freed", "expected"), [
    # 0.4e9-element buckets, 4 bytes each. Before unit k's bucket is issued the queue is
    # trimmed to at most 1e9 elements (2 buckets once it held 3), so while a unit fills at
    # most 3 queued + 1 filling = 1.6e9 elements are held: 6.4e9 bytes.
    (0.0, 6.4e9),
    # Each unit done frees 0.5e9 bytes of activations: 1.6e9, 3.2e9 - 0.5e9, 4.8e9 - 1.0e9,
    # then the 4th unit fills beside 3 queued: 6.4e9 - 1.5e9 = 4.9e9, after which the queue
    # stays at 1.6e9 elements while the freed activations grow.
    (0.5e9, 4.9e9),
])
def test_the_queue_holds_what_megatron_fsdp_frees_only_past_its_capacity(freed, expected):
    assert reduce_queue_bytes(0.4e9, 8, queue_params=1e9, grad_bytes=4,
                              freed_per_unit=freed) == pytest.approx(expected)


def test_a_queue_below_capacity_holds_every_bucket_of_the_backward():
    # 3 buckets of 1e8 never exceed 1e9 elements: all 3 are held when the last one fills.
    assert reduce_queue_bytes(1e8, 3, queue_params=1e9, grad_bytes=2,
                              freed_per_unit=0.0) == pytest.approx(3 * 1e8 * 2)


@pytest.mark.parametrize(("settings", "grad_bytes"), [
    (None, 4),                             # fp32 main grads, sharded
    ({"grad_reduce_in_bf16": True}, 2 + 4),  # bf16 shard + the step's fp32 copy of it
])
def test_gradients_and_optimizer_state_are_sharded_and_weights_kept(settings, grad_bytes):
    result = _estimate(TINY, 2, settings=settings)
    params = result.model.num_params  # tp 1, pp 1: every parameter on every GPU, all trained
    memory = result.estimate.memory_breakdown_gib
    assert memory["gradients"] == pytest.approx(grad_bytes * params / 8 / GIB)
    assert memory["optimizer"] == pytest.approx((4 + 8) * params / 8 / GIB)
    assert memory["weights"] == pytest.approx(2 * params / GIB)


@pytest.mark.parametrize(("model", "ep"), [(TINY, 1), ("examples/models/hf_mixtral_tiny.py", 8)])
def test_the_backward_holds_at_most_every_gradient_of_the_gpu_unsharded(model, ep):
    # The queue adds to the activation side; it cannot exceed the GPU's gradients in fp32,
    # which ZeRO-1 holds whole (with EP 8 the GPU holds 1/8 of each MoE block's experts).
    pins = {"tp": 1, "pp": 1, "dp": 8, "ep": ep, "mbs": 1}
    memory = [autoplan.estimate(model, DGX1, pins | {"zero": zero}, seq_len=256,
                                global_batch=16, runtime="megatron"
                                ).estimate.memory_breakdown_gib for zero in (1, 2)]
    assert 0 < memory[1]["activations"] - memory[0]["activations"] <= memory[0]["gradients"]


def test_the_peak_moment_names_the_queue():
    # Llama 2 7B at 256 tokens: at ZeRO-1 the loss (32,000 logits per token in fp32) sets the
    # peak; ZeRO-2's queue of unsharded gradients (gigabytes) moves it into a block's
    # backward, where the queue sits, not the loss, which runs before any gradient exists.
    problem = make_problem(load_model(LLAMA), load_cluster(DGX1),
                           training_spec(256, 16, "bf16", "megatron", "flash"))
    moments = [peak_moments(problem, plan_from_pins(problem, Pins(tp=1, pp=1, dp=8, zero=zero,
                                                                  mbs=1)))[0]
               for zero in (1, 2)]
    assert moments[0].startswith("the loss") and "queued" not in moments[0]
    assert moments[1].startswith(
        "the backward of a block beside the unsharded gradients queued for its reduce-scatters")


def test_every_micro_batch_reduce_scatters_its_gradients():
    # No overlap: ZeRO-1 reduce-scatters the fp32 gradients (4 bytes) once and all-gathers the
    # bf16 parameters (2 bytes) once; ZeRO-2 reduce-scatters after each of the 4 micro-batches.
    # Ring collectives move (n-1)/n of their bytes each, so with bandwidth dominating (a 7B
    # model): (4 x 4 + 2) / (4 + 2) = 3.
    times = [_estimate(LLAMA, zero, settings=NO_OVERLAP, global_batch=32)
             .estimate.time_breakdown_s["dp_comm"] for zero in (1, 2)]
    assert times[1] / times[0] == pytest.approx(18 / 6, rel=0.01)


def test_overlapped_reductions_expose_no_more_than_run_one_after_another():
    overlapped = [_estimate(LLAMA, zero, global_batch=32).estimate.time_breakdown_s["dp_comm"]
                  for zero in (1, 2)]
    serial = _estimate(LLAMA, 2, settings=NO_OVERLAP, global_batch=32
                       ).estimate.time_breakdown_s["dp_comm"]
    assert overlapped[0] <= overlapped[1] < serial


def test_the_search_proposes_zero2_only_when_asked():
    # It moves a Megatron-LM launch to Megatron-FSDP (fsdp_dtensor checkpoints): asked for
    # with --zero 2, not chosen on its own where another stage fits (ZeRO-1 fits here).
    cluster = "examples/clusters/dgx-a100-x1.yaml"
    plain = autoplan.solve(TINY, cluster, seq_len=256, global_batch=16, runtime="megatron")
    asked = autoplan.solve(TINY, cluster, seq_len=256, global_batch=16, runtime="megatron",
                           pins={"zero": 2})
    assert plain.plan.zero_stage != 2
    assert asked.plan.zero_stage == 2 and asked.estimate.feasible


def test_where_nothing_else_fits_zero2_is_searched():
    # Llama 2 7B on one node of A100 40GB at TP 1, PP 1: ZeRO-1 holds 2 + 4 + 12/8 bytes per
    # parameter, 47 GiB before any activation; ZeRO-2 2 + (4 + 12)/8 = 4 bytes, 25 GiB.
    cluster = {"gpu": "a100-sxm4-40gb", "nodes": 1, "gpus_per_node": 8,
               "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"}}
    kwargs = dict(seq_len=256, global_batch=16, runtime="megatron")
    found = autoplan.solve(LLAMA, cluster, pins={"tp": 1, "pp": 1}, **kwargs)
    params = found.model.num_params
    assert (2 + 4 + 12 / 8) * params / GIB > 40
    assert found.plan.zero_stage == 2 and found.estimate.feasible
    memory = found.estimate.memory_breakdown_gib
    assert memory["weights"] + memory["gradients"] + memory["optimizer"] == pytest.approx(
        4 * params / GIB)
    with pytest.raises(autoplan.InfeasibleError):
        autoplan.solve(LLAMA, cluster, pins={"tp": 1, "pp": 1, "zero": 1}, **kwargs)
