"""The caching-allocator replay against its rules in c10/cuda/CUDACachingAllocator.cpp
(kMinBlockSize 512 B, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kMinLargeAlloc
10 MiB, kRoundLarge 2 MiB, should_split, best fit, merging on free), each case worked by hand,
and against a real allocation sequence recorded from torch on this CPU."""

from __future__ import annotations

import torch

from autoplan.costmodels.allocator import CachingAllocator, allocation_size, replay, round_size
from autoplan.costmodels.memory import cublas_workspace_bytes
from autoplan.verify.memory import allocation_records, peak_of_records

MIB = 2**20


def test_requests_round_to_512_bytes():
    assert (round_size(1), round_size(512), round_size(513)) == (512, 512, 1024)


def test_segment_sizes_by_request():
    """<= 1 MiB: a 2 MiB segment; under 10 MiB: 20 MiB; else rounded up to 2 MiB."""
    assert allocation_size(MIB) == 2 * MIB
    assert allocation_size(MIB + 512) == 20 * MIB
    assert allocation_size(10 * MIB - 512) == 20 * MIB
    assert allocation_size(10 * MIB) == 10 * MIB
    assert allocation_size(11 * MIB) == 12 * MIB


def test_mid_sized_requests_share_a_20_mib_segment():
    """6 MiB requests: the first cudaMallocs 20 MiB and splits off 14, the second splits that
    into 6 + 8, the third 8 into 6 + 2; the fourth finds only 2 MiB free and cudaMallocs a
    second segment: 40 MiB reserved, 24 allocated."""
    a = CachingAllocator()
    for _ in range(3):
        a.malloc(6 * MIB)
    assert (a.reserved, a.allocated) == (20 * MIB, 18 * MIB)
    a.malloc(6 * MIB)
    assert (a.reserved, a.allocated) == (40 * MIB, 24 * MIB)


def test_a_rest_of_one_mib_or_less_is_not_split_off():
    """A 19 MiB request in a free 20 MiB block leaves 1 MiB, not more than kSmallSize: the
    request holds the whole block and allocated counts 20 MiB."""
    a = CachingAllocator()
    first, second = a.malloc(6 * MIB), a.malloc(6 * MIB)
    a.free(first)
    a.free(second)  # merges with the 8 MiB rest and the first 6: one free 20 MiB block
    a.malloc(19 * MIB)
    assert (a.reserved, a.allocated) == (20 * MIB, 20 * MIB)


def test_a_block_serves_only_requests_no_larger_than_itself():
    """Free 12 MiB and 16 MiB segments cannot serve a 24 MiB request: reserved grows to 52 MiB
    though 28 MiB are free (the fragmentation the allocator leaves)."""
    a = CachingAllocator()
    a.free(a.malloc(12 * MIB))
    a.free(a.malloc(16 * MIB))
    a.malloc(24 * MIB)
    assert (a.reserved, a.allocated, a.peak_allocated) == (52 * MIB, 24 * MIB, 24 * MIB)


def test_best_fit_takes_the_smallest_block_that_fits():
    """With free 12 and 16 MiB segments, a 12 MiB request takes the 12 MiB one whole and a
    following 16 MiB request the other: nothing new is reserved."""
    a = CachingAllocator()
    a.free(a.malloc(12 * MIB))
    a.free(a.malloc(16 * MIB))
    a.malloc(12 * MIB)
    a.malloc(16 * MIB)
    assert (a.reserved, a.allocated) == (28 * MIB, 28 * MIB)


def test_replayed_real_sequence_allocates_what_torch_recorded():
    """A Linear's forward and backward recorded on this CPU: the replay's allocated peak is
    the recorded live bytes at their peak plus at most what the rules add to each block (512
    bytes of rounding, and a large block's unsplit rest of at most 1 MiB), and it reserves at
    least that."""
    from torch.profiler import ProfilerActivity, profile
    layer = torch.nn.Linear(512, 2048)
    x = torch.randn(1024, 512, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layer(x).relu().sum().backward()
    records = allocation_records(prof)
    allocator = replay(records)
    live = peak_of_records(records)
    allocations = sum(1 for _, size, _ in records if size > 0)
    assert live <= allocator.peak_allocated <= live + (512 + MIB) * allocations
    assert allocator.peak_reserved >= allocator.peak_allocated


def test_torch_default_cublas_workspaces():
    """Two handles (forward thread, autograd's backward thread), each with torch's default
    workspace: 4096 KiB x 8 = 32 MiB on sm_90, 4096 KiB x 2 + 16 KiB x 8 elsewhere
    (CublasHandlePool.cpp parseChosenWorkspaceSize)."""
    assert cublas_workspace_bytes(9.0) == 2 * 32 * MIB
    assert cublas_workspace_bytes(8.0) == 2 * (8 * MIB + 128 * 1024)
    assert cublas_workspace_bytes(10.0) == 2 * (8 * MIB + 128 * 1024)


def test_a_full_device_returns_its_free_segments_before_growing():
    """``release_cached_blocks``: with the device full, every request that needs a segment
    first returns the wholly free ones. The case above: the 16 MiB request returns the free
    12 MiB segment, the 24 MiB one the free 16: never more than 24 MiB reserved. A segment
    with a live block stays: 12 MiB live, a free 16 MiB segment returned, 12 + 24 = 36."""
    a = CachingAllocator(release_before_growing=True)
    a.free(a.malloc(12 * MIB))
    a.free(a.malloc(16 * MIB))
    a.malloc(24 * MIB)
    assert (a.reserved, a.peak_reserved) == (24 * MIB, 24 * MIB)
    b = CachingAllocator(release_before_growing=True)
    b.malloc(12 * MIB)
    b.free(b.malloc(16 * MIB))
    b.malloc(24 * MIB)
    assert b.reserved == 36 * MIB
