"""How many collectives DeepSpeed ZeRO-3 issues per micro-batch (each paying its ring latency
over the DP group, which at hundreds of ranks is milliseconds per call). Expected values: the
installed DeepSpeed's config defaults, and a step-by-step replay of its parameter
coordinator's fetch and prefetch loop (partitioned_param_coordinator.py fetch_sub_module)
written here from that code, not from costmodels.sync."""

from __future__ import annotations

import math

import pytest

from autoplan.costmodels.profiles import runtime_profile
from autoplan.costmodels.sync import bucketed_reduction, zero3_calls

zero_config = pytest.importorskip("deepspeed.runtime.zero.config")


def test_the_profile_states_deepspeeds_zero3_defaults():
    config = zero_config.DeepSpeedZeroConfig()
    profile = runtime_profile("deepspeed")
    assert profile.zero3_prefetch_bucket_params == config.prefetch_bucket_size == 5e7
    assert profile.zero3_max_live_params == config.max_live_parameters == 1e9
    assert profile.reduce_bucket_params == config.reduce_bucket_size == 5e8


def _replayed_forward_gathers(sizes: list[float], prefetch: float, max_live: float) -> int:
    """all_gather_coalesced calls of one forward over modules of ``sizes`` (elements), as
    fetch_sub_module issues them: the module's own parameters if not in flight, then one
    prefetch of the trace's next not-yet-available parameters until ``min(prefetch,
    max_live - available)`` elements are taken; the module is released after its forward."""
    available = [False] * len(sizes)
    queue = list(range(len(sizes)))
    live, calls = 0.0, 0
    for i, size in enumerate(sizes):
        if not available[i]:
            available[i], live, calls = True, live + size, calls + 1
        queue = [j for j in queue if j > i]  # its own entry popped off the trace
        budget, taken = min(max_live - live, prefetch), 0.0
        while queue and taken < budget:
            j = queue.pop(0)
            if not available[j]:
                available[j], live, taken = True, live + sizes[j], taken + sizes[j]
        calls += taken > 0
        live -= size  # released after its forward
    return calls


def test_small_models_gather_a_prefetch_bucket_per_call():
    """A 1.3B GPT at TP 2: ~0.66e9 parameters per GPU in 24 blocks of 4 Linear modules
    (c_attn 2048 x 6144 / 2 = 6.3M, c_proj 2.1M, c_fc 8.4M, c_proj 8.4M per GPU).
    Worked by hand: all fit under the 1e9 live limit, so each module fetch prefetches at least
    5e7 more elements (whole parameters: up to one module more): the first module's gather
    and about 6.6e8 / 5.4e7 prefetches, 13 in the replay; the model prices ceil(6.6e8 / 5e7)
    = 14 gathers per pass, not 97; gradients reduce-scattered in ceil(6.6e8 / 5e8) = 2
    buckets: 2 x 14 + 2 = 30 collectives."""
    block = [6.29e6, 2.10e6, 8.39e6, 8.39e6]
    sizes = block * 24 + [52.4e6]  # and the 51200 x 2048 / 2 embedding, gathered last
    params = sum(sizes)
    config = zero_config.DeepSpeedZeroConfig()
    replayed = _replayed_forward_gathers(sizes, config.prefetch_bucket_size,
                                         config.max_live_parameters)
    assert math.ceil(params / 5e7) == 14
    assert replayed in (13, 14)
    assert zero3_calls(runtime_profile("deepspeed"), params, params, len(sizes)) == 30


def test_large_models_gather_module_by_module_once_the_live_limit_binds():
    """A 175B-like stage per GPU, 2.4e9 parameters in 384 modules of 6.25M: the first 1e9
    live elements come in 5e7 prefetches (20 calls, 160 modules), then each release frees
    room for about one module, one call each for the other 224: by hand 20 + 224 = 244 per
    pass (the replay: a few fewer, where a budget just over one module takes two); with
    ceil(2.4e9 / 5e8) = 5 reduce-scatters, 2 x 244 + 5 = 493."""
    sizes = [6.25e6] * 384
    params = sum(sizes)
    replayed = _replayed_forward_gathers(sizes, 5e7, 1e9)
    assert replayed == pytest.approx(244, rel=0.1)
    assert zero3_calls(runtime_profile("deepspeed"), params, params, len(sizes)) == 493


def test_fsdp_gathers_and_reduces_once_per_wrapped_block():
    """FSDP's FlatParameter per block: one all-gather in forward, one in backward, one
    reduce-scatter per block, whatever the block's size: 3 x 32 = 96."""
    assert zero3_calls(runtime_profile("fsdp"), 8e9, 8e9, 32) == 96


def test_zero_1_2_reduce_one_reduce_bucket_per_collective():
    """stage_1_and_2.py all-reduces the gradients one reduce_bucket_size (5e8 elements) bucket
    at a time: a GPU holding 1.2e9 trained parameters issues ceil(1.2e9 / 5e8) = 3 calls of
    2.4 GB / 3 = 0.8 GB of bf16 gradients each (Megatron's profile states no such bucket
    here: one call)."""
    calls = []

    def reduce(nbytes, links):
        calls.append(nbytes)
        return 1.0

    # each call priced at 1 s: three of them, priced once at their common size
    assert bucketed_reduction(runtime_profile("deepspeed"), reduce, 1.2e9, 2.4e9, None) == 3.0
    assert calls == [pytest.approx(0.8e9)]
    calls.clear()
    assert bucketed_reduction(runtime_profile("megatron"), reduce, 1.2e9, 2.4e9, None) == 1.0
    assert calls == [2.4e9]
