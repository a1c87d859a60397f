"""The host side of a step (costmodels/host.py): kernels per block against the frameworks' own
code and real torch, and what the host adds with and without CUDA_LAUNCH_BLOCKING, worked by
hand."""

from __future__ import annotations

import dataclasses

import pytest

import autoplan
from autoplan.costmodels.host import (
    COMPLETION_SECONDS_PER_KERNEL,
    HOST_SECONDS_PER_KERNEL,
    block_kernels,
    host_delay_s,
    runtime_block_kernels,
)
from autoplan.costmodels.profiles import runtime_profile
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.graph.models import model_file

# Megatron's ParallelTransformerLayer (bigscience-workshop/Megatron-DeepSpeed
# megatron/model/transformer.py, fused kernels on), kernel by kernel, TP collectives apart.
MEGATRON_FORWARD = {
    "input LayerNorm (apex FusedLayerNormAffineFunction)": 1,
    "QKV F.linear with bias (addmm: bias copy, GEMM)": 2,
    "baddbmm (scores)": 1,
    "FusedScaleMaskSoftmax": 1,
    "attention dropout": 1,
    "bmm (context)": 1,
    "permute(2, 0, 1, 3).contiguous()": 1,
    "dense F.linear, skip_bias_add": 1,
    "bias_dropout_add_fused_train (add, dropout + add)": 2,
    "post-attention LayerNorm": 1,
    "dense_h_to_4h F.linear, skip_bias_add": 1,
    "bias_gelu_impl": 1,
    "dense_4h_to_h F.linear, skip_bias_add": 1,
    "bias_dropout_add_fused_train": 2,
}
MEGATRON_BACKWARD = {
    "bias_dropout_add: dropout mask, residual grad add, bias-grad sum": 3,
    "dense_4h_to_h: dgrad, wgrad": 2,
    "bias_gelu: fused gelu grad, bias-grad sum": 2,
    "dense_h_to_4h: dgrad, wgrad": 2,
    "post-attention LayerNorm: input grad, partial and final gamma/beta grads": 3,
    "residual gradient add": 1,
    "bias_dropout_add after attention": 3,
    "dense: dgrad, wgrad": 2,
    "contiguous copy": 1,
    "bmm: two bmm": 2,
    "dropout: masked scale": 1,
    "softmax backward": 1,
    "baddbmm: two bmm": 2,
    "split_tensor_along_last_dim: cat of the q, k, v grads": 1,
    "QKV: dgrad, wgrad, bias-grad sum": 3,
    "input LayerNorm": 3,
    "residual gradient add into the block's input": 1,
    "AccumulateGrad: weights and biases of 2 LayerNorms and 4 Linears": 12,
}


def test_megatron_runtimes_issue_the_kernels_of_megatrons_layer():
    for name in ("megatron", "deepspeed"):
        runtime = runtime_profile(name)
        assert runtime.block_forward_kernels == sum(MEGATRON_FORWARD.values()) == 17
        assert runtime.block_backward_kernels == sum(MEGATRON_BACKWARD.values()) == 45


def test_fsdp_block_kernels_are_torchtitans_block_run_on_cpu():
    """torchtitan's Llama block run eager with real torch under TorchDispatchMode
    (benchmarks/host_overhead.py): every dispatched aten op that is not a view or an
    allocation is one kernel."""
    from host_overhead import block_kernels as measured

    forward, backward = measured()
    runtime = runtime_profile("fsdp")
    assert (runtime.block_forward_kernels, runtime.block_backward_kernels) == (
        sum(forward.values()), sum(backward.values()))
    assert forward["mm"] == 7 and backward["mm"] == 14  # 7 Linears: dgrad and wgrad each


def test_compile_issues_the_compiled_blocks_kernels():
    """Inductor's graphs of torchtitan's block (benchmarks/host_overhead.py, torch 2.13): 29
    forward and 38 backward kernels, and AccumulateGrad's add into each of the block's 9
    parameters (7 Linear weights, 2 RMSNorm weights) outside the graph: 38 + 9."""
    fsdp = runtime_profile("fsdp")
    assert runtime_block_kernels(fsdp) == (36, 75)
    assert runtime_block_kernels(dataclasses.replace(fsdp, compile=True)) == (29, 38 + 9)
    megatron = dataclasses.replace(runtime_profile("megatron"), compile=True)
    assert runtime_block_kernels(megatron) == (17, 45)  # no compiled counts: as eager


def test_tp_adds_its_collectives_and_full_recompute_the_forward_again():
    # Megatron's block at TP 8 without SP: 2 row-parallel all-reduces forward (attention dense,
    # 4h->h) and 2 column-parallel ones backward: 17 + 2 = 19, 45 + 2 = 47; with SP each is an
    # all-gather and a reduce-scatter: 17 + 4 = 21, 45 + 4 = 49. Per micro-batch under full
    # recompute: 19 + 19 + 47 = 85.
    plain = block_kernels(17, 45, tp_collectives=2, tp=8, sequence_parallel=False)
    assert (plain.forward, plain.backward) == (19, 47)
    assert plain.per_micro_batch(recomputed=True) == 85
    assert plain.per_micro_batch(recomputed=False) == 66
    sp = block_kernels(17, 45, tp_collectives=2, tp=8, sequence_parallel=True)
    assert (sp.forward, sp.backward) == (21, 49)
    alone = block_kernels(17, 45, tp_collectives=2, tp=1, sequence_parallel=False)
    assert (alone.forward, alone.backward) == (17, 45)


def test_async_launches_hide_the_host_behind_longer_gpu_work():
    # 85 kernels x 12 us = 1.02 ms of host time per micro-batch.
    assert host_delay_s(2.0e-3, 85, launch_blocking=False) == 0.0
    assert host_delay_s(0.5e-3, 85, launch_blocking=False) == pytest.approx(1.02e-3 - 0.5e-3)


def test_blocking_launches_add_host_time_and_each_completion():
    # 85 x (12 + 5.8) us = 1.513 ms whatever the GPU time.
    assert HOST_SECONDS_PER_KERNEL + COMPLETION_SECONDS_PER_KERNEL == pytest.approx(17.8e-6)
    for gpu_s in (0.5e-3, 50e-3):
        assert host_delay_s(gpu_s, 85, launch_blocking=True) == pytest.approx(1.513e-3)


SMALL = LlamaConfig(num_layers=4, hidden_size=2048, num_heads=16, num_kv_heads=16,
                    ffn_hidden_size=5504, vocab_size=32000)
small = model_file("host_llama", lambda: Llama(SMALL), loss=next_token_loss)


def _compute_s(examples, **settings) -> float:
    pins = {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "zero": 1, "recompute": "none"}
    result = autoplan.estimate(small, examples / "clusters" / "dgx-a100-x1.yaml", pins,
                               seq_len=512, global_batch=16, runtime="deepspeed",
                               runtime_settings=settings or None)
    return result.estimate.time_breakdown_s["compute"]


def test_a_blocking_step_pays_every_blocks_kernels(examples):
    """4 blocks, 2 micro-batches per GPU (16 / 8 GPUs), no TP, no recompute: 17 + 45 = 62
    kernels per block and micro-batch, each 17.8 us under CUDA_LAUNCH_BLOCKING, against the
    same step without the host priced: 2 x 4 x 62 x 17.8 us = 8.8288 ms."""
    unpriced = _compute_s(examples, block_forward_kernels=0)
    blocking = _compute_s(examples, launch_blocking=True)
    assert blocking - unpriced == pytest.approx(2 * 4 * 62 * 17.8e-6, rel=1e-6)
