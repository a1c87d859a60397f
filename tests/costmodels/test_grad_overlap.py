"""Megatron's --overlap-grad-reduce / --overlap-param-gather as megatron-core schedules them,
checked against schedules worked by hand."""

import pytest

from autoplan.costmodels.profiles import runtime_profile
from autoplan.costmodels.sync import (
    begun_at,
    bucket_sizes,
    filled_at,
    gathered_ahead,
    grad_bucket_params,
    reduced_as_ready,
)


def test_bucket_size_is_megatron_cores_default():
    # megatron-core 0.16.1 distributed_data_parallel.py:
    #   bucket_size = max(40000000, 1000000 * dp_group.size())
    profile = runtime_profile("megatron")
    assert grad_bucket_params(profile, 8) == 40_000_000
    assert grad_bucket_params(profile, 64) == 64_000_000
    assert grad_bucket_params(profile, 1024) == 1_024_000_000


def test_params_are_cut_into_full_buckets_and_a_remainder():
    assert bucket_sizes(100e6, 40e6) == [40e6, 40e6, 20e6]
    assert bucket_sizes(80e6, 40e6) == [40e6, 40e6]
    assert bucket_sizes(0.0, 40e6) == []


def test_a_long_backward_leaves_only_the_last_bucket_exposed():
    # 4 equal buckets of 1 ms under a 10 ms backward: ready at 2.5, 5, 7.5, 10 ms, done at
    # 3.5, 6, 8.5, 11 ms: 1 ms (the last bucket) after the backward ends.
    ready = filled_at([1.0] * 4, 0.0, 10e-3)
    assert ready == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 10e-3])
    assert reduced_as_ready(ready, [1e-3] * 4, 10e-3) == pytest.approx(1e-3)


def test_a_short_backward_leaves_the_backlog_exposed():
    # 4 buckets of 5 ms under an 8 ms backward: ready at 2, 4, 6, 8 ms, the stream busy from
    # 2 ms on: done at 7, 12, 17, 22 ms -> 14 ms exposed (= 4 * 5 - 8 * 3/4).
    ready = filled_at([1.0] * 4, 0.0, 8e-3)
    assert reduced_as_ready(ready, [5e-3] * 4, 8e-3) == pytest.approx(14e-3)


def test_a_small_last_bucket_is_ready_last_and_exposed_alone():
    # buckets of 3, 1 (parameter shares 3/4, 1/4) taking 3 ms and 1 ms under a 4 ms
    # backward: ready at 3 and 4 ms, done at 6 and 7 ms -> 3 ms exposed.
    ready = filled_at([3.0, 1.0], 0.0, 4e-3)
    assert reduced_as_ready(ready, [3e-3, 1e-3], 4e-3) == pytest.approx(3e-3)


def test_an_earlier_chunk_reduces_under_the_later_chunks_backward():
    # Interleaved, 2 chunks, pp 4, 1 ms per chunk-backward: chunk A finishes its last backward
    # at 1 ms, chunk B runs its last from 4 to 5 ms (pp = 4 chunk-backwards later). One 3 ms
    # bucket each: A's runs 1-4 ms, B's 5-8 ms -> 3 ms past the 5 ms end (B's bucket alone).
    ready = filled_at([1.0], 0.0, 1e-3) + filled_at([1.0], 4e-3, 1e-3)
    assert reduced_as_ready(ready, [3e-3, 3e-3], 5e-3) == pytest.approx(3e-3)


def test_prefetched_gathers_expose_the_first_bucket_or_the_backlog():
    # 4 buckets of 1 ms ahead of an 8 ms forward (layers need them at 0, 2, 4, 6 ms): the
    # gathers finish at 1, 2, 3, 4 ms; the first layer waits 1 ms, the others not at all.
    needed = begun_at([1.0] * 4, 0.0, 8e-3)
    assert needed == pytest.approx([0.0, 2e-3, 4e-3, 6e-3])
    assert gathered_ahead(needed, [1e-3] * 4) == pytest.approx(1e-3)
    # 3 ms each: done at 3, 6, 9, 12 ms against 0, 2, 4, 6 ms -> the last waits 6 ms.
    assert gathered_ahead(needed, [3e-3] * 4) == pytest.approx(6e-3)


def test_megatron_estimate_hides_all_but_the_last_bucket_under_a_long_backward():
    # gpt_13b, TP8 x DP2 over two DGX A100 nodes: ~1.6B parameters per GPU, 40M-parameter
    # buckets. Reduced after the backward (the launch without --overlap-grad-reduce) every
    # bucket is exposed; with it, the backward of a micro-batch of four 2048-token sequences (~0.6 s) covers all
    # but the last of the ~40 buckets: at most a few buckets' worth stays exposed.
    import autoplan
    pins = {"tp": 8, "pp": 1, "dp": 2, "mbs": 4, "zero": 0, "recompute": "full"}
    args = dict(seq_len=2048, global_batch=16, runtime="megatron")
    cluster = "examples/clusters/dgx-a100-x16.yaml"
    on = autoplan.estimate("examples/models/gpt_13b.py", cluster, pins, **args)
    off = autoplan.estimate("examples/models/gpt_13b.py", cluster, pins, **args,
                            runtime_settings={"overlap_grad_reduce": False})
    hidden, exposed = on.estimate.time_breakdown_s["dp_comm"], off.estimate.time_breakdown_s["dp_comm"]
    assert 0 < hidden < exposed / 10


def test_ddp_buckets_are_torchs_defaults():
    # torch.nn.parallel.DistributedDataParallel: bucket_cap_mb 25 MiB, the first bucket
    # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES; in fp32 gradients: 6,553,600 and
    # 262,144 parameters.
    import torch.distributed as dist
    from torch.nn.parallel import distributed as ddp
    profile = runtime_profile("fsdp")
    assert profile.ddp_bucket_bytes == ddp._DEFAULT_BUCKET_CAP_MB * 2**20
    assert profile.ddp_first_bucket_bytes == dist._DEFAULT_FIRST_BUCKET_BYTES
    # 10M fp32 gradients: 262,144 + 6,553,600 + the remaining 3,184,256
    assert bucket_sizes(10e6, 6_553_600, 262_144) == [262_144, 6_553_600, 3_184_256]
