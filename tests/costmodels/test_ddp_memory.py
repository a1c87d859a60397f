"""Gradient copies of data-parallel wrappers: torch DDP's buckets beside ``param.grad``, and a
runtime that accumulates into its fp32 buffer only after the whole backward (nanotron's
FP32GradientAccumulator). Expected values come from real torch on CPU and from hand counts of
the frameworks' source."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.costmodels.memory import ddp_bucket_copy_bytes
from autoplan.costmodels.step import peak_moments
from autoplan.training import Pins
from autoplan.zoo import Llama
from tests.graph.models import LLAMA_GQA, llama_gqa

SEQ, BATCH = 64, 8


def _ddp_buckets(gradient_as_bucket_view: bool) -> tuple[int, int, int]:
    """(bucket bytes, parameter count, gradients that lie inside a bucket) of real torch DDP
    over a one-rank gloo group on CPU, after one backward."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=gradient_as_bucket_view)
        buckets = []

        def record(_, bucket):
            buffer = bucket.buffer()
            buckets.append((buffer.data_ptr(), buffer.numel() * buffer.element_size()))
            done = torch.futures.Future()
            done.set_result(buffer)
            return done

        ddp.register_comm_hook(None, record)
        ddp(torch.randn(4, 256)).sum().backward()
        inside = sum(any(start <= p.grad.data_ptr() < start + size for start, size in buckets)
                     for p in model.parameters())
        return (sum(size for _, size in buckets), sum(p.numel() for p in model.parameters()),
                inside)
    finally:
        dist.destroy_process_group()


def test_ddp_buckets_hold_a_second_copy_of_every_gradient_on_real_torch():
    """With torch's default ``gradient_as_bucket_view=False`` the buckets hold every fp32
    gradient (4 bytes x 262,912 parameters) and no ``.grad`` lies inside them: a second copy,
    as priced. With the view option the gradients are the buckets (no copy)."""
    bucket_bytes, params, inside = _ddp_buckets(gradient_as_bucket_view=False)
    assert params == 256 * 512 + 512 + 512 * 256 + 256
    assert inside == 0
    assert ddp_bucket_copy_bytes(params, bytes_per_param=4, data_parallel=2, zero_stage=0,
                                 max_zero_stage=0) == bucket_bytes
    assert _ddp_buckets(gradient_as_bucket_view=True)[2] == 4


def _estimate(examples, pins, runtime="fsdp", cluster="dgx-a100-x1.yaml", seq=SEQ, **settings):
    return autoplan.estimate(llama_gqa, examples / "clusters" / cluster, pins, seq_len=seq,
                             global_batch=BATCH, runtime=runtime,
                             runtime_settings=settings or None).estimate


def _trained_params() -> int:
    return sum(p.numel() for p in Llama(LLAMA_GQA).parameters())


def test_fsdp_zero0_holds_ddps_copy_only_under_data_parallelism(examples):
    """The fsdp runtime runs ZeRO 0 as DDP over fp32 parameters (autocast): its gradients gain
    the buckets' 4-byte copy of every parameter (the model counted by torch itself) with two
    replicas, none on one GPU, and none under FSDP (ZeRO 3), which reduce-scatters instead."""
    params = _trained_params()

    def gradients(pins, **settings):
        return _estimate(examples, pins, **settings).memory_breakdown_gib["gradients"] * 2**30

    ddp = {"dp": 2, "zero": 0, "mbs": 1}
    assert gradients(ddp) - gradients(ddp, ddp_bucket_copy_bytes=0) == pytest.approx(4 * params)
    one = {"dp": 1, "zero": 0, "mbs": 1}
    assert gradients(one) == gradients(one, ddp_bucket_copy_bytes=0)
    sharded = {"dp": 2, "zero": 3, "mbs": 1}
    assert gradients(sharded) == gradients(sharded, ddp_bucket_copy_bytes=0)


def test_accumulating_after_the_whole_backward_holds_every_16_bit_gradient(examples):
    """nanotron's FP32GradientAccumulator.backward runs ``loss.backward()`` and only then adds
    each bf16 ``.grad`` into the fp32 buffer and frees it: on one GPU with one micro-batch in
    flight, once its activations are freed, 2 bytes x every parameter exist at once. At 4
    tokens that outweighs the backward's activations and transient, so the peak rises by the
    difference (with the allocator's 10% slack on activation-side bytes)."""
    pins = {"dp": 1, "mbs": 1, "recompute": "full"}
    plain = _estimate(examples, pins, runtime="megatron", cluster="a100-x1.yaml", seq=4)
    whole = _estimate(examples, pins, runtime="megatron", cluster="a100-x1.yaml", seq=4,
                      grads_before_accumulation_bytes=2)
    backward = plain.memory_breakdown_gib["activations"] * 2**30
    copies = 2 * _trained_params()
    assert copies > backward
    extra = (whole.peak_memory_gib - plain.peak_memory_gib) * 2**30
    assert extra == pytest.approx((copies - backward) * 1.10)


def test_explain_names_the_whole_stage_gradients_moment(examples):
    """When the 16-bit gradients of the whole stage set the peak (the case above), explain names
    that moment, not a backward."""
    cluster = load_cluster(examples / "clusters" / "a100-x1.yaml")
    problem = make_problem(load_model(llama_gqa), cluster,
                           training_spec(4, BATCH, "bf16", "megatron", "flash"),
                           runtime_settings={"grads_before_accumulation_bytes": 2})
    plan = plan_from_pins(problem, Pins(dp=1, mbs=1, recompute="full"))
    assert peak_moments(problem, plan)[0].startswith("the 16-bit gradients of the whole stage")
