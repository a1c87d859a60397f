"""PyTorch's CUDA caching allocator, replayed: what it reserves for a sequence of allocations
and frees, by the rules of c10/cuda/CUDACachingAllocator.cpp with its defaults (no expandable
segments, ``max_split_size`` unlimited, one stream).

- Every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``, ``round_size``).
- Requests of at most 1 MiB (``kSmallSize``) come from the small pool, the others from the large
  pool; a block never moves between pools.
- A request takes the smallest free block of its pool that is large enough (``get_free_block``:
  ``lower_bound`` on size). Without one the allocator cudaMallocs a new segment of
  ``get_allocation_size``: 2 MiB (``kSmallBuffer``) for small requests, 20 MiB (``kLargeBuffer``)
  for requests under 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB
  (``kRoundLarge``).
- The block found is split when the rest is worth keeping (``should_split``): at least 512 bytes
  in the small pool, more than 1 MiB in the large one; otherwise the request holds it whole, and
  ``allocated`` counts the whole block.
- A freed block merges with free neighbours of its segment (``try_merge_blocks``); segments stay
  reserved (the cache) and count in ``reserved`` until ``empty_cache``.
- When cudaMalloc fails for want of device memory, the allocator frees every cached segment
  that holds no live block (``release_cached_blocks``) and tries again; only then does it
  raise the out-of-memory error. ``release_before_growing`` replays a device that is always
  that full: the reserved peak is then the least the sequence needs (live segments with their
  free fragments, and the new request).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
"""``kMinBlockSize``: every request is rounded up to a multiple of it."""
SMALL_SIZE = 2**20
"""``kSmallSize``: the largest small-pool request, and the rest a large split must exceed."""
SMALL_BUFFER = 2 * 2**20
"""``kSmallBuffer``: the segment a small request cudaMallocs."""
LARGE_BUFFER = 20 * 2**20
"""``kLargeBuffer``: the segment a large request under ``MIN_LARGE_ALLOC`` cudaMallocs."""
MIN_LARGE_ALLOC = 10 * 2**20
"""``kMinLargeAlloc``: from this size on a request gets a segment of its own size."""
ROUND_LARGE = 2 * 2**20
"""``kRoundLarge``: such a segment is rounded up to a multiple of it."""


def round_size(size: int) -> int:
    """The block size a request of ``size`` bytes takes (``round_size``)."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request no cached block serves
    (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(block_size: int, size: int) -> bool:
    """Whether a free block of ``block_size`` serving a request of ``size`` is split
    (``should_split``, max_split_size unlimited)."""
    remaining = block_size - size
    return remaining >= MIN_BLOCK if size <= SMALL_SIZE else remaining > SMALL_SIZE


@dataclass(slots=True)
class _Block:
    segment: int
    offset: int
    size: int
    live: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        """The order in which the allocator's free-block set finds it: size, then address."""
        return (self.size, self.segment, self.offset)


@dataclass
class CachingAllocator:
    """A replay of the allocator on one stream. ``malloc`` returns a handle for ``free``;
    ``allocated``, ``reserved`` and their peaks are in bytes as torch.cuda.memory_stats counts
    them (``allocated_bytes`` counts whole blocks, ``reserved_bytes`` segments)."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    _segments: list[list[_Block]] = field(default_factory=list)
    _free: dict[bool, list[tuple[int, int, int]]] = field(
        default_factory=lambda: {True: [], False: []})
    _by_key: dict[tuple[int, int, int], _Block] = field(default_factory=dict)
    _small: list[bool] = field(default_factory=list)
    release_before_growing: bool = False

    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        block = self._take_best_fit(size) or self._new_segment(size)
        if should_split(block.size, size):
            blocks = self._segments[block.segment]
            rest = _Block(block.segment, block.offset + size, block.size - size)
            blocks.insert(blocks.index(block) + 1, rest)
            self._cache(rest)
            block.size = size
        block.live = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: _Block) -> None:
        block.live = False
        self.allocated -= block.size
        blocks = self._segments[block.segment]
        i = blocks.index(block)
        if i + 1 < len(blocks) and not blocks[i + 1].live:
            block.size += self._uncache(blocks.pop(i + 1)).size
        if i > 0 and not blocks[i - 1].live:
            block = self._uncache(blocks[i - 1])
            block.size += blocks.pop(i).size
        self._cache(block)

    def _cache(self, block: _Block) -> None:
        bisect.insort(self._free[self._small[block.segment]], block.key)
        self._by_key[block.key] = block

    def _uncache(self, block: _Block) -> _Block:
        keys = self._free[self._small[block.segment]]
        del keys[bisect.bisect_left(keys, block.key)]
        return self._by_key.pop(block.key)

    def _take_best_fit(self, size: int) -> _Block | None:
        keys = self._free[size <= SMALL_SIZE]
        i = bisect.bisect_left(keys, (size, -1, -1))
        return self._uncache(self._by_key[keys[i]]) if i < len(keys) else None

    def _new_segment(self, size: int) -> _Block:
        if self.release_before_growing:
            self._release_free_segments()
        grant = allocation_size(size)
        block = _Block(len(self._segments), 0, grant)
        self._segments.append([block])
        self._small.append(size <= SMALL_SIZE)
        self.reserved += grant
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block


    def _release_free_segments(self) -> None:
        """``release_cached_blocks``: every segment whose one block is free goes back to the
        device."""
        for blocks in self._segments:
            if len(blocks) == 1 and not blocks[0].live:
                self.reserved -= self._uncache(blocks.pop()).size


def replay(records: list[tuple[int, int, int]]) -> CachingAllocator:
    """Replays ``(time, bytes, address)`` records in time order (bytes > 0 allocates at that
    address, < 0 frees it), as torch.profiler records a real run on CPU
    (autoplan.verify.memory). As there, a new allocation at a live address retires the old
    block first (threads' clocks interleave), and frees of memory allocated before the
    recording began are skipped."""
    allocator = CachingAllocator()
    live: dict[int, tuple[int, _Block]] = {}
    for _, nbytes, address in sorted(records):
        if nbytes > 0:
            if address in live:
                allocator.free(live.pop(address)[1])
            live[address] = (nbytes, allocator.malloc(nbytes))
        elif live.get(address, (0,))[0] == -nbytes:
            allocator.free(live.pop(address)[1])
    return allocator
