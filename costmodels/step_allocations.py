"""A pipeline stage's training step as the sequence of allocations and frees the framework
issues, replayed through PyTorch's caching allocator (costmodels/allocator.py): what the
allocator reserves at the step's high-water mark, beyond what is allocated, and which moment
sets it.

The sequence, per micro-batch on one GPU (model states are resident buffers of their own
segments, allocated before the step, so they are left out):

- forward: each layer's saved tensors, kept until that layer's backward (1F1B: ``held - 1``
  warm-up forwards, then one forward and the oldest micro-batch's backward in turn, so a
  backward runs with ``held`` micro-batches in flight; interleaved, each chunk's forwards and
  backwards in the schedule's order, pipeline.schedule_order: ``replay_schedule``);
- backward, layer by layer from the last: the layer's working set (a recomputed layer's
  activations, the gradients it produces) is allocated, then freed with the layer's saved
  tensors;
- after the last backward, the gradient reduction's and the optimizer step's transients, one
  after the other (``step_transients``: flat bucket copies, casts, the norm's copies).

The freed blocks stay cached: a later request takes a cached block only if one is at least as
large (``CachingAllocator``), so a transient larger than every activation block the backward
left behind gets a new segment on top of them, and that is what nvidia-smi and
``torch.cuda.max_memory_reserved`` show at the step while the device has room. Where it has
none, the allocator returns its wholly free segments before it raises out-of-memory: replayed
with ``release_before_growing``, the step's reserved peak is the least it needs, and a stage
runs out of memory only when that exceeds the device. Replaying ``held + 2`` micro-batches
reaches the 1F1B steady state (each later forward and backward requests the same sizes);
replays are memoized on their sizes, so the search pays for each distinct stage shape once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from autoplan.costmodels.allocator import (
    SMALL_SIZE,
    CachingAllocator,
    allocation_size,
    round_size,
)

STEADY_MICROBATCHES = 2
"""Micro-batches replayed beyond the warm-up: the first steady forward/backward pair requests
blocks the warm-up's tensors left, the second repeats the first's sizes."""


@dataclass(frozen=True, slots=True)
class LayerTensors:
    """One layer's tensors per micro-batch on one GPU, in bytes: ``kept`` saved for backward,
    ``working`` alive while its backward runs; ``count`` such layers in a row."""

    kept: tuple[int, ...]
    working: tuple[int, ...]
    count: int = 1


@dataclass(frozen=True, slots=True)
class StageOutput:
    """The stage output a pipeline engine keeps per micro-batch (``bytes``): until that
    micro-batch's backward, or where ``slots`` > 0 (DeepSpeed's last stage: its pipe buffers
    keep the logits, memory.last_stage_output_slots) until a forward ``slots`` micro-batches
    later writes its own output into the same buffer."""

    bytes: int
    slots: int = 0


@dataclass(frozen=True, slots=True)
class StepReplay:
    """What the replayed step's dynamic allocations reach, in bytes: the allocated and reserved
    peaks over the forwards and backwards, and the reserved peak over the whole step (the
    gradient reduction and the optimizer step included); the step's transient allocated, and
    the reserved peak while the transients run."""

    backward_allocated: int
    backward_reserved: int
    reserved: int
    step_allocated: int
    step_reserved: int = 0

    @property
    def backward_excess(self) -> int:
        """What the allocator reserves beyond the allocated bytes at the backward's peak."""
        return self.backward_reserved - self.backward_allocated

    @property
    def step_new_segments(self) -> int:
        """What the step's transients add to the reserved memory: segments for requests no
        block cached by the backward serves."""
        return self.reserved - self.backward_reserved


def tensors_of(total: float, unit: float, shapes: tuple[int, ...] = ()) -> tuple[int, ...]:
    """``total`` bytes as the tensors a layer allocates: first the layer's own tensor sizes
    (``shapes``, largest first, each taken once while it fits: attention scores, GEMM
    outputs), then whole tensors of ``unit`` bytes (the hidden-state tensor the rest of a
    transformer's activations are made of), the rest one smaller tensor."""
    if total <= 0:
        return ()
    taken = []
    for size in sorted(shapes, reverse=True):
        if 0 < size <= total:
            taken.append(int(size))
            total -= size
    if unit <= 0 or unit >= total:
        return tuple(taken) + ((int(total),) if total >= 1 else ())
    whole, rest = divmod(total, unit)
    return tuple(taken) + (int(unit),) * int(whole) + ((int(rest),) if rest >= 1 else ())


@dataclass(frozen=True, slots=True)
class StepSegments:
    """The step's allocator high-water by the closed-form rule (:func:`step_segments`), in
    bytes beyond the backward's reserved peak (``new``) and on a full device (``least``: the
    pipe buffers and the largest transient, every other cached segment returned)."""

    new: int
    least: int


@lru_cache(maxsize=4096)  # a search asks again for about half the stages it prices
def step_segments(layers: tuple[LayerTensors, ...], *, num_microbatches: int,
                  step_transients: tuple[int, ...] = (),
                  output: StageOutput | None = None) -> StepSegments:
    """What :func:`replay_step` finds at the step, without replaying: after the last backward
    every activation block is free and merged back into its segment, so the cached blocks are
    the segments themselves, the largest of them the segment of the largest request the
    forwards and backwards made (``allocation_size``: segments never grow). A transient no
    larger than the largest cached block of the large pool is served from the cache (best fit
    never needs more than one block); a larger one cudaMallocs its own segment, which then
    serves the transients after it; a small-pool transient (1 MiB or less) finds its block
    among the backward's small ones. On a full device the allocator returns the free segments
    before it grows, leaving the outputs the pipe buffers keep (counted as allocated: smaller
    ones share segments) and the largest transient's segment."""
    largest = _largest_segment(layers, output)
    new = 0
    large = [round_size(size) for size in step_transients if round_size(size) > SMALL_SIZE]
    for size in large:
        if size > largest:
            largest = allocation_size(size)
            new += largest
    buffered = (min(output.slots, num_microbatches) * round_size(output.bytes)
                if output is not None and output.slots else 0)
    least = buffered + max((allocation_size(size) for size in large), default=0)
    return StepSegments(new, least)


@lru_cache(maxsize=4096)
def _largest_segment(layers: tuple[LayerTensors, ...], output: StageOutput | None) -> int:
    """The largest large-pool segment the forwards and backwards of ``layers`` (and the kept
    ``output``) cudaMalloc. Memoized: the search asks for it with every step's transients."""
    requests = {size for layer in layers for size in layer.kept + layer.working}
    if output is not None:
        requests.add(output.bytes)
    blocks = {round_size(size) for size in requests}  # a layer's tensors are mostly one size
    return max((allocation_size(block) for block in blocks if block > SMALL_SIZE), default=0)


@lru_cache(maxsize=4096)
def replay_step(layers: tuple[LayerTensors, ...], *, held: int, num_microbatches: int,
                step_transients: tuple[int, ...] = (), output: StageOutput | None = None,
                release_before_growing: bool = False) -> StepReplay:
    """Replays one step of a 1F1B stage running ``layers`` with ``held`` micro-batches in
    flight at its peak (the schedule's warm-up plus one) out of ``num_microbatches``, keeping
    each micro-batch's ``output``; ``release_before_growing``: on a device too full to grow
    without returning the cache (allocator.CachingAllocator), so the peaks are the least the
    step needs."""
    replayed = min(num_microbatches, held + STEADY_MICROBATCHES)
    warmup = min(held, replayed) - 1
    order = ((True, 0),) * warmup + ((True, 0), (False, 0)) * (replayed - warmup) + (
        (False, 0),) * warmup
    return replay_schedule((layers,), order=order, step_transients=step_transients,
                           output=output, release_before_growing=release_before_growing)


@lru_cache(maxsize=4096)
def replay_schedule(chunks: tuple[tuple[LayerTensors, ...], ...], *,
                    order: tuple[tuple[bool, int], ...], step_transients: tuple[int, ...] = (),
                    output: StageOutput | None = None,
                    release_before_growing: bool = False) -> StepReplay:
    """Replays one step of a rank running ``chunks`` (an interleaved rank's model chunks, in
    order) in the schedule's ``order`` of ``(is_forward, chunk)`` steps (pipeline.schedule_order;
    a backward frees its chunk's oldest micro-batch in flight), the last chunk keeping each
    micro-batch's ``output``, then the step's transients."""
    stage = _Stage(CachingAllocator(release_before_growing=release_before_growing), chunks,
                   output)
    in_flight: list[list[list[list]]] = [[] for _ in chunks]
    for forward, chunk in order:
        if forward:
            in_flight[chunk].append(stage.forward(chunk))
        else:
            stage.backward(chunk, in_flight[chunk].pop(0))
    allocator = stage.allocator
    backward_allocated, backward_reserved = allocator.peak_allocated, allocator.peak_reserved
    base = allocator.allocated  # the pipe buffers that outlive the backward
    step_allocated = step_reserved = 0
    for size in step_transients:
        block = allocator.malloc(size)
        step_allocated = max(step_allocated, allocator.allocated - base)
        step_reserved = max(step_reserved, allocator.reserved)
        allocator.free(block)
    return StepReplay(backward_allocated, backward_reserved, allocator.peak_reserved,
                      step_allocated, step_reserved)


@dataclass
class _Stage:
    """The allocations of one rank's forwards and backwards of its chunks, and the outputs its
    pipe buffers keep (the last chunk's)."""

    allocator: CachingAllocator
    chunks: tuple[tuple[LayerTensors, ...], ...]
    output: StageOutput | None
    buffered: list = field(default_factory=list)

    def _layers(self, chunk: int) -> list[LayerTensors]:
        return [layer for layer in self.chunks[chunk] for _ in range(layer.count)]

    def _output(self, chunk: int) -> StageOutput | None:
        return self.output if chunk == len(self.chunks) - 1 else None

    def forward(self, chunk: int) -> list[list]:
        """One micro-batch's forward of ``chunk``: the saved tensors of each layer in order,
        then its output (the last entry)."""
        saved = [[self.allocator.malloc(size) for size in layer.kept]
                 for layer in self._layers(chunk)]
        output = self._output(chunk)
        if output is None:
            return saved
        block = self.allocator.malloc(output.bytes)
        if not output.slots:
            return saved + [[block]]
        self.buffered.append(block)
        if len(self.buffered) > output.slots:
            self.allocator.free(self.buffered.pop(0))
        return saved + [[]]

    def backward(self, chunk: int, saved: list[list]) -> None:
        """One micro-batch's backward of ``chunk``, last layer first: its working set comes
        and goes, then its saved tensors are freed; the output, unless a pipe buffer keeps
        it, goes first."""
        if self._output(chunk) is not None:
            for block in saved.pop():
                self.allocator.free(block)
        for layer, kept in zip(reversed(self._layers(chunk)), reversed(saved)):
            working = [self.allocator.malloc(size) for size in layer.working]
            for block in reversed(working):
                self.allocator.free(block)
            for block in kept:
                self.allocator.free(block)
