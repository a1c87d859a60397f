"""Candidate generators: the discrete choices a plan is made of, already filtered by the rules
the frameworks enforce (divisibility, heads vs TP, SP needs TP, interleaving needs whole
chunks and a micro-batch count that is a multiple of PP, what each runtime supports).

Only this module decides what is a legal plan; the solver and the brute-force reference both
take their candidates from here (the brute force without the dominance pruning).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from itertools import product
from typing import Iterable

from autoplan.capabilities import OFFLOAD_MIN_ZERO, RUNTIMES, lack_reason, missing, pinned_features
from autoplan.cluster.spec import Cluster
from autoplan.costmodels.experts import common_expert_count
from autoplan.degrees import plan_fields
from autoplan.errors import ConstraintError, InfeasibleError
from autoplan.graph.layer_graph import LayerGraph, LayerKind, TpSplit
from autoplan.plan import Offload, PipelineSchedule, Plan, Recompute, Stage
from autoplan.training import (
    DEFAULT_PLACEMENT, AttentionKernel, Bounds, Pins, Runtime, TrainingSpec,
)

MAX_MICRO_BATCH = 64
"""Micro-batches beyond this only add activation memory; no published plan uses more."""

CP_MIN_TOKENS = 4096
"""Context parallelism is searched while each GPU keeps at least this many tokens of a
sequence: shorter blocks leave too little attention per ring step to hide the next KV block's
transfer (NeMo's Llama 3 405B recipe runs cp=2 at 8192 tokens, Llama 3 cp=16 at 128K)."""

MAX_UNEVEN_CHUNKS = 16
"""Uneven interleaving is searched up to this many chunks per rank: the bubble is then already
1/16 of 1F1B's, and deep models (1,000 blocks) would otherwise add dozens of options per pp."""

@dataclass(frozen=True, slots=True)
class Shape:
    """The integer degrees of a plan (everything but the memory-saving switches)."""

    tp: int
    pp: int
    dp: int
    cp: int
    mbs: int
    vpp: int
    placement: str = DEFAULT_PLACEMENT
    ep: int = 1

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.mbs)


def family_of(shape: Shape) -> tuple:
    """What a shape's memory per GPU depends on besides its data-parallel degree, micro-batch
    and rank placement (see leanest_members)."""
    return shape.tp, shape.pp, shape.cp, shape.vpp, shape.ep


def leanest_members(shapes_: Iterable[Shape]) -> dict[tuple, list[Shape]]:
    """Per family (family_of), the shapes no other shape of the family beats in memory: with
    the rest fixed, more data parallelism never needs more memory per GPU (fewer micro-batches
    in flight, ZeRO shards over more ranks) once there are two replicas or more, a smaller
    micro-batch never more (activations scale with it) and the placement none at all. So these
    are the shapes of largest DP for each smallest micro-batch (the Pareto front), and the
    smallest micro-batch on one replica, which has no data-parallel wrapper to copy its
    gradients (DDP's buckets: costmodels.memory.ddp_bucket_copy_bytes); if none of them fits,
    no member does (checked by enumeration in tests/search/test_pruning.py)."""
    smallest: dict[tuple, dict[int, Shape]] = {}
    for shape in shapes_:
        by_dp = smallest.setdefault(family_of(shape), {})
        if shape.dp not in by_dp or shape.mbs < by_dp[shape.dp].mbs:
            by_dp[shape.dp] = shape
    front: dict[tuple, list[Shape]] = {}
    for family, by_dp in smallest.items():
        members, least_mbs = [], math.inf
        for dp in sorted(by_dp, reverse=True):
            if by_dp[dp].mbs < least_mbs or dp == 1:
                members.append(by_dp[dp])
                least_mbs = min(least_mbs, by_dp[dp].mbs)
        front[family] = members
    return front


def divisors(n: int) -> list[int]:
    return list(_divisors(n))


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    """Kept: a search asks for the divisors of the same few counts thousands of times."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def balanced_stages(graph: LayerGraph, pp: int, vpp: int = 1, *, first: int | None = None,
                    last: int | None = None) -> tuple[Stage, ...]:
    """Split the chain into ``pp * vpp`` contiguous chunks.

    Blocks are divided as evenly as possible (extra blocks go to the middle chunks); the layers
    before the first block join chunk 0 and those after the last block join the final chunk
    (Megatron's placement of embedding and head). ``first``/``last`` fix the number of blocks
    of the first and last chunk (Megatron's ``--decoder-first/last-pipeline-num-layers``).
    """
    blocks = graph.block_indices()
    return _balanced_stages(len(graph.layers), blocks[0] if blocks else None, len(blocks),
                            pp, vpp, first, last)


@functools.lru_cache(maxsize=4096)
def _balanced_stages(num_layers: int, first_block: int | None, num_blocks: int, pp: int,
                     vpp: int, first: int | None, last: int | None) -> tuple[Stage, ...]:
    """``balanced_stages`` from what it depends on, kept (``_stages_at``)."""
    chunks = pp * vpp
    if chunks == 1:
        return (Stage(first_layer=0, num_layers=num_layers),)
    if not num_blocks:
        return _split_chain(num_layers, chunks)
    counts = (_interleaved_counts(num_blocks, pp, vpp) if vpp > 1 and first is None
              and last is None else _block_counts(num_blocks, chunks, first, last))
    return _stages_at(num_layers, first_block, tuple(counts))


def stages_of_counts(graph: LayerGraph, counts) -> tuple[Stage, ...]:
    """The chunks that run ``counts[i]`` consecutive blocks each, in pipeline order: the layers
    before the first block join chunk 0 and those after the last block the final chunk."""
    return _stages_at(len(graph.layers), graph.block_indices()[0], tuple(counts))


@functools.lru_cache(maxsize=16384)
def _stages_at(num_layers: int, first_block: int, counts: tuple[int, ...]) -> tuple[Stage, ...]:
    """``stages_of_counts`` from what it depends on, kept: the search cuts the same stages
    thousands of times, and its memos hash and compare them, which is cheap when equal
    stages are the same records."""
    starts, position = [], first_block
    for count in counts:
        starts.append(position)
        position += count
    starts[0] = 0
    ends = starts[1:] + [num_layers]
    return tuple(Stage(first_layer=s, num_layers=e - s) for s, e in zip(starts, ends))


def block_counts(graph: LayerGraph, stages: tuple[Stage, ...]) -> tuple[int, ...]:
    """Blocks in each chunk of ``stages``."""
    blocks = set(graph.block_indices())
    return tuple(sum(i in blocks for i in range(s.first_layer, s.first_layer + s.num_layers))
                 for s in stages)


def compositions(total: int, parts: int):
    """Every way to write ``total`` as ``parts`` positive counts, lexicographically (the
    brute-force reference's stage splits)."""
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


def _block_counts(num_blocks: int, chunks: int, first: int | None, last: int | None) -> list[int]:
    fixed = [c for c in (first, last) if c is not None]
    middle = chunks - len(fixed)
    rest = num_blocks - sum(fixed)
    base, extra = divmod(rest, middle)
    offset = (middle - extra) // 2
    counts = [base + (offset <= i < offset + extra) for i in range(middle)]
    if first is not None:
        counts.insert(0, first)
    if last is not None:
        counts.append(last)
    return counts


def _interleaved_counts(num_blocks: int, pp: int, vpp: int) -> list[int]:
    """Blocks of each chunk (pipeline order; chunk c runs on rank c % pp) when interleaving:
    the ranks' totals as even as possible with the spare blocks on the middle ranks (rank 0
    and the last also run embedding and head), each rank's total spread over its chunks."""
    return list(chunk_counts(_block_counts(num_blocks, pp, None, None), vpp))


def chunk_counts(rank_totals, vpp: int) -> tuple[int, ...]:
    """Blocks of each chunk in pipeline order (chunk c runs on rank c % pp) from each rank's
    total, spread over its ``vpp`` chunks as evenly as possible (``rank_chunk_counts``)."""
    pp = len(rank_totals)
    counts = [0] * (pp * vpp)
    for rank, total in enumerate(rank_totals):
        for chunk, count in enumerate(rank_chunk_counts(total, vpp)):
            counts[chunk * pp + rank] = count
    return tuple(counts)


def rank_chunk_counts(total: int, vpp: int) -> list[int]:
    """One rank's ``total`` blocks over its ``vpp`` chunks, as even as possible, the spare
    ones on the middle chunks."""
    return _block_counts(total, vpp, None, None)


def stages_of_rank_totals(graph: LayerGraph, rank_totals, vpp: int) -> tuple[Stage, ...]:
    """The layout whose ranks run ``rank_totals`` blocks, each spread over its chunks
    (``chunk_counts``): the splits CP-SAT chooses, interleaved or not."""
    return stages_of_counts(graph, chunk_counts(tuple(rank_totals), vpp))


def rank_block_totals(graph: LayerGraph, stages: tuple[Stage, ...], pp: int) -> tuple[int, ...]:
    """Blocks each pipeline rank runs over its chunks of ``stages`` (chunk c on rank c % pp)."""
    counts = block_counts(graph, stages)
    return tuple(sum(counts[rank::pp]) for rank in range(pp))


def _split_chain(num_layers: int, chunks: int) -> tuple[Stage, ...]:
    base, extra = divmod(num_layers, chunks)
    stages, start = [], 0
    for i in range(chunks):
        size = base + (i < extra)
        stages.append(Stage(first_layer=start, num_layers=size))
        start += size
    return tuple(stages)


def uniform_blocks(graph: LayerGraph) -> bool:
    """All blocks consecutive and alike (their costs the same), so a stage's cost depends on
    how many blocks it has, not which."""
    blocks = graph.block_indices()
    if not blocks or blocks != list(range(blocks[0], blocks[-1] + 1)):
        return False
    same = replace(graph.layers[blocks[0]], name="", modules=())
    return all(replace(graph.layers[i], name="", modules=()) == same for i in blocks)


CHOSEN_SPLIT_MAX_PP = 8
"""Deepest pipeline whose split CP-SAT chooses. Its middle stages are one class of
interchangeable rows (``search.partition.interchangeable_classes``), so the model searches
their counts in one order; up to 8 ranks the searches stay within their time (530B GPT on 5,128
A100: 1.1 s warm against 0.8 s at 4 ranks). Deeper, where memory caps every stage near the
same count, the window around the optimum holds dozens of splits a few ns apart and each table
took 0.1-0.9 s to enumerate (16 ranks: 3.7 s; 64: 16 s on that job), so deeper pipelines keep
the menu, whose lighter first/last stages are what a split there moves."""

CHOSEN_INTERLEAVED_SPLIT_MAX_PP = 4
"""Deepest interleaved pipeline (vpp > 1) whose split CP-SAT chooses: every vpp a shape
allows is a table of its own per switch setting, and the stage costs of each (a rank's
chunks priced at each count) are most of a search's work. Up to 4 ranks, BLOOM 176B on 1,024
A100 takes 6.7 s (3.6 s with the menu alone) and gains 1.1%, GPT-3 175B 6.8 s (2.4 s) for
nothing; up to 8, BLOOM took 9.4 s for 2.4% (benchmarks/partition_gain.py, README)."""


def split_is_chosen(graph: LayerGraph, pp: int, vpp: int) -> bool:
    """Whether any split of the blocks over the ranks is a candidate (CP-SAT chooses it,
    ``search.partition``): at most CHOSEN_SPLIT_MAX_PP ranks (CHOSEN_INTERLEAVED_SPLIT_MAX_PP
    interleaved) over blocks that are all alike, each rank's blocks spread evenly over its
    chunks (``stages_of_rank_totals``). Otherwise the candidates are ``stage_variants``."""
    deepest = CHOSEN_SPLIT_MAX_PP if vpp == 1 else CHOSEN_INTERLEAVED_SPLIT_MAX_PP
    return 1 < pp <= deepest and uniform_blocks(graph)


def split_plans(graph: LayerGraph, shape: Shape, training: TrainingSpec, pins: Pins):
    """Every split of the blocks over the ranks (``compositions`` of at least one block a
    chunk, lexicographically; each rank's spread over its chunks) with the switches of the
    balanced layout (partial recompute up to its largest chunk), for the brute force."""
    balanced = balanced_stages(graph, shape.pp, shape.vpp)
    options = switches(shape, runtime=training.runtime, pins=pins,
                       blocks_per_chunk=max_chunk_blocks(graph, balanced))
    for totals in compositions(len(graph.block_indices()), shape.pp):
        if min(totals) < shape.vpp:
            continue
        stages = stages_of_rank_totals(graph, totals, shape.vpp)
        for sw in options:
            yield make_plan(shape, sw, stages, training)


def stage_variants(graph: LayerGraph, pp: int, vpp: int) -> list[tuple[Stage, ...]]:
    """The even split plus first/last stages lighter by one or two blocks (they also hold the
    embedding and the head), where every chunk keeps at least one block."""
    blocks = len(graph.block_indices())
    chunks = pp * vpp
    variants = [balanced_stages(graph, pp, vpp)]
    if vpp > 1 or pp < 3 or not blocks:
        return variants
    even = -(-blocks // pp)
    for cut_first, cut_last in ((1, 0), (0, 1), (1, 1), (2, 0), (0, 2), (2, 2)):
        first, last = even - cut_first, even - cut_last
        rest = blocks - first - last
        if min(first, last) >= 1 and rest % (chunks - 2) == 0 and rest // (chunks - 2) >= 1:
            variant = balanced_stages(graph, pp, vpp, first=first, last=last)
            if variant not in variants:
                variants.append(variant)
    return variants


def tp_split_counts(graph: LayerGraph) -> dict[int, str]:
    """What tensor parallelism splits, as {count: the first thing of that size}: attention
    heads and KV heads, the output features of column-parallel Linears and the input features of
    row-parallel ones (Megatron's ColumnParallelLinear/RowParallelLinear assert an even split).
    The vocabulary-parallel head is left out: Megatron-LM (and Megatron-DeepSpeed) pad the
    vocabulary to a multiple of 128 x TP (``--make-vocab-size-divisible-by``), and DTensor
    shards an uneven vocabulary in torchtitan."""
    counts: dict[int, str] = {}
    dims = graph.dims
    for count in graph.tp_divisors:
        what = "attention heads" if dims and count == dims.num_heads else "KV heads"
        counts.setdefault(count, f"the {count} {what}")
    vocab = dims.vocab_size if dims else None
    for layer in graph.layers:
        for gemm in layer.gemms:
            if gemm.split is TpSplit.COLUMN and not (
                    layer.kind is LayerKind.HEAD and gemm.out_features == vocab):
                counts.setdefault(gemm.out_features, f"layer {layer.name}: Linear {gemm.name} "
                                  f"({gemm.out_features} output features, column-parallel)")
            elif gemm.split is TpSplit.ROW:
                counts.setdefault(gemm.in_features, f"layer {layer.name}: Linear {gemm.name} "
                                  f"({gemm.in_features} input features, row-parallel)")
    return counts


def check_tp(graph: LayerGraph, tp: int, *, world: int) -> None:
    """Reject a TP degree that does not split some layer evenly, naming it and the degrees
    that do (up to ``world``).

    Raises:
        ConstraintError: the first thing ``tp`` does not divide.
    """
    counts = tp_split_counts(graph)
    bad = next((what for count, what in counts.items() if count % tp), None)
    if bad is None:
        return
    legal = [d for d in divisors(math.gcd(*counts)) if d <= world]
    raise ConstraintError(
        f"--tp {tp} does not divide {bad}: tensor parallelism splits it into equal parts. "
        f"TP degrees that split every layer of {graph.name}: {', '.join(map(str, legal))}.")


def tp_options(graph: LayerGraph, gpus_per_node: int, pinned: int | None) -> list[int]:
    """TP degrees that split every layer evenly (tp_split_counts) and divide a node's GPUs:
    TP's all-reduces sit on the critical path of every layer, so practice (Narayanan et al.
    2021, sec. 3.3: "up to degree g") keeps them on NVLink. A pinned --tp may cross nodes."""
    options = [pinned] if pinned is not None else divisors(gpus_per_node)
    counts = tp_split_counts(graph)
    return [t for t in options if all(c % t == 0 for c in counts)]


def pp_options(graph: LayerGraph, gpus: int, pinned: int | None) -> list[int]:
    """PP degrees with at least one block (or layer) each that divide either the blocks (even
    stages) or the GPUs available (full use of the cluster, stages made uneven)."""
    depth = len(graph.block_indices()) or len(graph.layers)
    options = sorted(set(divisors(depth)) | {p for p in divisors(gpus) if p <= depth})
    return [p for p in options if pinned is None or p == pinned]


def dp_options(global_batch: int, gpus: int, pinned: int | None, *,
               every: bool = False) -> list[int]:
    """The two largest data-parallel degrees that divide the global batch and fit in ``gpus``.

    Dominance: with everything else fixed, more data parallelism leaves fewer micro-batches per
    replica and never more memory per GPU, so smaller degrees only matter when the larger one's
    extra gradient traffic outweighs that; the runner-up covers that case. The dominance is
    about time only: ``every`` keeps all degrees (objectives that reward fewer GPUs).
    """
    if pinned is not None:
        return [pinned] if pinned <= gpus and global_batch % pinned == 0 else []
    fitting = [d for d in divisors(global_batch) if d <= gpus]
    return fitting if every else fitting[-2:]


def vpp_options(graph: LayerGraph, pp: int, num_microbatches: int, pinned: int | None, *,
                interleaving: bool = True, uneven: bool = False) -> list[int]:
    """Interleaving needs pp > 1 (megatron-core 0.16.1's parallel_state: "pipeline-model-
    parallel size should be greater than 1 with interleaved schedule"; older Megatron asked
    more than 2), at least one block per chunk and m a multiple of pp. Chunks hold equal blocks, except where pp does not divide the blocks and the runtime
    takes an ``uneven`` layout (Megatron's ``--pipeline-model-parallel-layout``): then any
    count up to one block per chunk, the spare blocks in the middle chunks (the first and last
    also hold embedding and head; Llama 3's 126 layers on 16 stages, Dubey et al. 2024)."""
    blocks = len(graph.block_indices())
    options = [1]
    if interleaving and pp > 1 and blocks and num_microbatches % pp == 0:
        options += [v for v in range(2, blocks // pp + 1) if blocks % (pp * v) == 0
                    or uneven and blocks % pp and v <= MAX_UNEVEN_CHUNKS]
    return [v for v in options if pinned is None or v == pinned]


def placement_options(runtime: Runtime, pp: int, dp: int, pinned: str | None) -> list[str]:
    """Rank orders the runtime can build; with pp or dp of 1 they place every group alike,
    so only the default is kept."""
    placements = RUNTIMES[runtime].placements
    if pinned is not None:
        return [pinned] if pinned in placements else []
    return list(placements) if pp > 1 and dp > 1 else [DEFAULT_PLACEMENT]


def ep_options(graph: LayerGraph, runtime: Runtime, replicas: int, pinned: int | None,
               tp: int = 1) -> list[int]:
    """Expert-parallel degrees: divisors of the experts every MoE layer has that divide the
    dp*cp ``replicas`` they are carved from; 1 for dense models and runtimes without EP (or
    without EP next to TP, when ``tp`` > 1)."""
    experts = common_expert_count(graph.layers) if graph.has_experts() else None
    caps = RUNTIMES[runtime]
    if experts is None or not caps.expert_parallel or tp > 1 and not caps.expert_parallel_with_tp:
        options = [1]
    else:
        options = [e for e in divisors(experts) if replicas % e == 0]
    return [e for e in options if pinned is None or e == pinned]


def cp_options(training: TrainingSpec, pinned: int | None) -> list[int]:
    """Context-parallel degrees: 1, and for runtimes with ring attention over flash kernels the
    powers of two that split the sequence into 2*cp equal chunks (Megatron's load balancing of
    causal attention) of at least CP_MIN_TOKENS tokens per GPU."""
    if pinned is not None:
        return [pinned]
    if not RUNTIMES[training.runtime].context_parallel or training.attention is not AttentionKernel.FLASH:
        return [1]
    options, cp = [1], 2
    while training.seq_len % (2 * cp) == 0 and training.seq_len // cp >= CP_MIN_TOKENS:
        options.append(cp)
        cp *= 2
    return options


def micro_batch_options(per_rank: int, training: TrainingSpec) -> list[int]:
    """Micro-batches that split a data-parallel rank's ``per_rank`` sequences; only all of them
    at once when the optimizer steps in backward (it cannot accumulate gradients)."""
    if training.optimizer_in_backward:
        return [per_rank] if per_rank <= MAX_MICRO_BATCH else []
    return [b for b in divisors(per_rank) if b <= MAX_MICRO_BATCH]


def shapes(graph: LayerGraph, *, world: int, gpus_per_node: int, training: TrainingSpec,
           pins: Pins, bounds: Bounds | None = None, every_dp: bool = False) -> list[Shape]:
    """All legal (tp, pp, dp, cp, mbs, vpp) on at most ``world`` GPUs for the global batch,
    within the user's ``bounds``; ``every_dp`` lifts the DP dominance (see dp_options)."""
    shapes_, caps = [], RUNTIMES[training.runtime]
    for cp, tp in product(cp_options(training, pins.cp), tp_options(graph, gpus_per_node, pins.tp)):
        if tp * cp > world:
            continue
        for pp in pp_options(graph, world // (tp * cp), pins.pp):
            for dp in dp_options(training.global_batch, world // (tp * pp * cp), pins.dp,
                                 every=every_dp):
                per_rank = training.global_batch // dp
                for mbs in micro_batch_options(per_rank, training):
                    if pins.mbs is not None and mbs != pins.mbs or (
                            pp > 1 and caps.pipeline_needs_microbatches and per_rank // mbs < pp):
                        continue
                    for vpp in vpp_options(graph, pp, per_rank // mbs, pins.vpp,
                                           interleaving=caps.interleaving,
                                           uneven=caps.uneven_interleaving):
                        shapes_ += [Shape(tp, pp, dp, cp, mbs, vpp, placement, ep)
                                    for ep in ep_options(graph, training.runtime, dp * cp, pins.ep,
                                                         tp)
                                    for placement
                                    in placement_options(training.runtime, pp, dp, pins.placement)]
    if bounds is not None:
        shapes_ = [s for s in shapes_ if bounds.admits(tp=s.tp, pp=s.pp, dp=s.dp, mbs=s.mbs,
                                                        vpp=s.vpp, cp=s.cp, ep=s.ep)]
    return shapes_


@dataclass(frozen=True, slots=True)
class Switches:
    """The memory-saving choices layered on a shape."""

    zero: int
    recompute: Recompute
    sp: bool
    offload: Offload
    recompute_num_layers: int | None = None  # full recompute of the first N blocks per chunk


def max_chunk_blocks(graph: LayerGraph, stages: tuple[Stage, ...]) -> int:
    """Blocks in the largest model chunk."""
    return max(block_counts(graph, stages))


def recompute_layer_options(runtime: Runtime, blocks_per_chunk: int, pins: Pins) -> list[int | None]:
    """Full recompute of every block (None) or of the first N blocks of each chunk, N in
    1..blocks-1 (Megatron's ``--recompute-method block``), where the runtime has it."""
    if pins.recompute_num_layers is not None:
        return [pins.recompute_num_layers]
    if not RUNTIMES[runtime].partial_recompute:
        return [None]
    return [None] + list(range(1, blocks_per_chunk))


def switches(shape: Shape, *, runtime: Runtime, pins: Pins,
             blocks_per_chunk: int = 1) -> list[Switches]:
    """ZeRO stage, recompute, SP and offload combinations the runtime can run on ``shape``
    whose largest model chunk has ``blocks_per_chunk`` blocks."""
    return _switches(shape.tp > 1, shape.pp > 1, runtime, pins, blocks_per_chunk, shape.ep > 1)


@functools.lru_cache(maxsize=1024)
def _switches(tensor_parallel: bool, pipelined: bool, runtime: Runtime, pins: Pins,
              blocks_per_chunk: int, expert_parallel: bool = False) -> list[Switches]:
    """switches(), which depends on the shape only through these (cached: called per stage
    layout of every shape): what the runtime's capability table allows (Megatron needs SP
    with both TP and EP, torchtitan's EP sharded data parallelism; a ZeRO stage proposed only
    when asked for, when pinned)."""
    caps = RUNTIMES[runtime]
    zeros = caps.pipeline_zero_stages if pipelined else caps.zero_stages
    zeros = tuple(z for z in zeros if z in caps.zero_stages and (
        z not in caps.asked_zero_stages or pins.zero == z) and (
        z < 3 or caps.zero3_with_tp or not tensor_parallel) and (
        z > 0 or not expert_parallel or not caps.expert_parallel_needs_sharding))
    options = []
    sps = (False, True) if tensor_parallel and caps.sequence_parallel else (False,)
    if tensor_parallel and (expert_parallel and caps.ep_with_tp_needs_sp or caps.tp_implies_sp):
        sps = (True,)
    offloads = (Offload.NONE, *caps.offloads)
    for zero, rc, sp, off in product(zeros, Recompute, sps, offloads):
        if zero < OFFLOAD_MIN_ZERO[off]:
            continue
        layers = recompute_layer_options(runtime, blocks_per_chunk, pins) if rc is Recompute.FULL else [None]
        for n in layers:
            if _pinned_out(pins, zero=zero, recompute=rc, sp=sp, offload=off,
                           recompute_num_layers=n):
                continue
            options.append(Switches(zero, rc, sp, off, n))
    return options


_RECOMPUTE_LEANNESS = {Recompute.FULL: 0, Recompute.SELECTIVE: 1, Recompute.NONE: 2}
_OFFLOAD_LEANNESS = {Offload.PARAMS: 0, Offload.OPTIMIZER: 1, Offload.NONE: 2}


def leanest(options: list[Switches]) -> Switches:
    """The switches that keep the least in GPU memory: with the ZeRO stage fixed, memory only
    falls with more recomputation (all blocks rather than the first N, and the fewer kept the
    better), with SP and with more offload, each independently, so the option leanest in
    every one of them needs no more memory than any other."""
    return min(options, key=lambda sw: (
        _RECOMPUTE_LEANNESS[sw.recompute], sw.recompute_num_layers is not None,
        -(sw.recompute_num_layers or 0), not sw.sp, _OFFLOAD_LEANNESS[sw.offload]))


def leanest_plans(members: Iterable[Shape], stages: tuple[Stage, ...], *, graph: LayerGraph,
                  training: TrainingSpec, pins: Pins) -> list[Plan]:
    """The memory-leanest plan of each ZeRO stage of each shape in ``members`` (one family's
    leanest_members) on ``stages``: if none of them fits, no plan of the family with these
    stages does (see leanest and leanest_members)."""
    blocks = max_chunk_blocks(graph, stages)
    plans = []
    for member in members:
        options = switches(member, runtime=training.runtime, pins=pins, blocks_per_chunk=blocks)
        plans += [make_plan(member, leanest([sw for sw in options if sw.zero == zero]), stages,
                            training)
                  for zero in sorted({sw.zero for sw in options})]
    return plans


def _pinned_out(pins: Pins, **values) -> bool:
    return any(getattr(pins, k) is not None and getattr(pins, k) != v for k, v in values.items())


def pipeline_schedule(runtime: Runtime, vpp: int) -> PipelineSchedule | None:
    """The schedule a plan runs: zero-bubble where the runtime has it for interleaved plans
    (it holds the interleaved schedule's memory and only shortens the bubble, Qi et al. 2023),
    else the default 1F1B / interleaved 1F1B (None)."""
    if RUNTIMES[runtime].zero_bubble and vpp >= 2:
        return PipelineSchedule.ZERO_BUBBLE
    return None


def make_plan(shape: Shape, sw: Switches, stages: tuple[Stage, ...], training: TrainingSpec) -> Plan:
    return Plan(
        **plan_fields(tp=shape.tp, pp=shape.pp, dp=shape.dp, cp=shape.cp, zero=sw.zero,
                      mbs=shape.mbs, recompute=sw.recompute,
                      recompute_num_layers=sw.recompute_num_layers, sp=sw.sp, vpp=shape.vpp,
                      offload=sw.offload, placement=shape.placement, ep=shape.ep),
        global_batch_size=training.global_batch,
        num_microbatches=shape.num_microbatches(training.global_batch),
        world_size=shape.tp * shape.pp * shape.dp * shape.cp,
        stages=stages, pipeline_schedule=pipeline_schedule(training.runtime, shape.vpp),
    )


def candidate_plans(graph: LayerGraph, *, world: int, gpus_per_node: int, training: TrainingSpec,
                    pins: Pins, bounds: Bounds | None = None, every_dp: bool = False,
                    every_split: bool = True):
    """Every legal plan: shapes x stage splits x switches (a generator). The splits are every
    composition of the blocks where ``split_is_chosen`` (``every_split`` False: the
    ``stage_variants`` menu instead, for enumerations too large to list)."""
    for shape in shapes(graph, world=world, gpus_per_node=gpus_per_node, training=training,
                        pins=pins, bounds=bounds, every_dp=every_dp):
        if every_split and split_is_chosen(graph, shape.pp, shape.vpp):
            yield from split_plans(graph, shape, training, pins)
            continue
        for stages in stage_variants(graph, shape.pp, shape.vpp):
            for sw in switches(shape, runtime=training.runtime, pins=pins,
                               blocks_per_chunk=max_chunk_blocks(graph, stages)):
                yield make_plan(shape, sw, stages, training)


def _check_cp(training: TrainingSpec, cp: int) -> None:
    """Reject a context-parallel degree the attention kernel or the sequence cannot take."""
    if training.attention is not AttentionKernel.FLASH:
        raise ConstraintError(
            f"--cp {cp} needs flash attention kernels (ring attention passes softmax statistics "
            "between blocks); use attention 'flash' or leave --cp unset.")
    if training.seq_len % (2 * cp):
        raise ConstraintError(
            f"--seq-len {training.seq_len} is not divisible by 2*cp = {2 * cp}: context "
            "parallelism splits each sequence into 2*cp equal chunks. Change --cp or --seq-len.")


def check_runtime(training: TrainingSpec, pins: Pins, *, node_groups: bool = False) -> None:
    """Reject pins (precision, a cluster of node groups) the runtime's capability table lacks,
    naming the runtimes that have them.

    Raises:
        InfeasibleError: e.g. "--vpp 2 --runtime deepspeed: DeepSpeed has no interleaved
            pipeline schedule; Megatron-LM and FSDP do".
    """
    lacking = missing(training.runtime, pinned_features(pins, training.precision.value,
                                                        node_groups=node_groups))
    if lacking:
        raise InfeasibleError(lack_reason(training.runtime, lacking)
                              + ". Change --runtime or leave those options unset.")


def check_pins(graph: LayerGraph, *, world: int, training: TrainingSpec, pins: Pins) -> None:
    """Reject pins that no plan can satisfy, saying why, before any search."""
    check_runtime(training, pins)
    degrees = [d for d in (pins.tp, pins.pp, pins.dp, pins.cp) if d is not None]
    product_ = 1
    for d in degrees:
        product_ *= d
    if product_ > world:
        raise ConstraintError(
            f"the pinned degrees multiply to {product_} GPUs but the cluster has {world}; "
            "tp*pp*dp*cp must not exceed the GPU count.")
    if pins.tp is not None:
        check_tp(graph, pins.tp, world=world)
    if pins.cp not in (None, 1):
        _check_cp(training, pins.cp)
    if pins.dp is not None and training.global_batch % pins.dp:
        raise ConstraintError(
            f"--global-batch {training.global_batch} is not divisible by --dp {pins.dp}; each "
            "data-parallel rank needs a whole number of sequences.")
    if pins.sp and pins.tp == 1:
        raise ConstraintError("--sp needs --tp > 1: sequence parallelism splits along TP.")
    if pins.sp is False and (pins.tp or 1) > 1 and RUNTIMES[training.runtime].tp_implies_sp:
        raise ConstraintError(
            f"--no-sp with --tp {pins.tp}: the {training.runtime.value} runtime (torchtitan) "
            "always applies sequence parallelism with TP; drop --no-sp.")
    if pins.ep not in (None, 1):
        check_ep(graph, training, pins)
    if pins.mbs is not None and training.global_batch % pins.mbs:
        raise ConstraintError(
            f"--global-batch {training.global_batch} is not divisible by --mbs {pins.mbs}; "
            "a micro-batch must split the batch evenly. Change --mbs or --global-batch.")
    if pins.mbs is not None and pins.dp is not None and training.global_batch % (pins.dp * pins.mbs):
        raise ConstraintError(
            f"--global-batch {training.global_batch} is not divisible by dp*mbs = "
            f"{pins.dp * pins.mbs}; change --mbs or --global-batch.")
    if (training.optimizer_in_backward and pins.mbs is not None and pins.dp is not None
            and pins.mbs * pins.dp != training.global_batch):
        raise ConstraintError(
            f"--optimizer-in-backward with --dp {pins.dp} --mbs {pins.mbs}: "
            f"{training.global_batch // (pins.dp * pins.mbs)} micro-batches per step would "
            "accumulate gradients, which a step in backward cannot (torchtune: \"Gradient "
            "accumulation is not supported with optimizer in bwd\"); make dp*mbs equal "
            "--global-batch or leave --optimizer-in-backward unset.")
    if pins.recompute_num_layers is not None and pins.recompute not in (None, Recompute.FULL):
        raise ConstraintError(
            f"--recompute-num-layers {pins.recompute_num_layers} needs --recompute full (it "
            f"recomputes the first N blocks of each chunk), not --recompute "
            f"{pins.recompute.value}.")
    if graph.layers and not any(l.kind is LayerKind.BLOCK for l in graph.layers) and pins.vpp not in (None, 1):
        raise ConstraintError("--vpp > 1 needs a model with repeated blocks to interleave.")
    _check_chunks(graph, pins.pp or 1, pins.vpp or 1)


def _check_chunks(graph: LayerGraph, pp: int, vpp: int) -> None:
    """Every pipeline chunk (pp * vpp of them) needs a block of its own, or a layer of a model
    without repeated blocks."""
    blocks = len(graph.block_indices())
    units, what = (blocks, "repeated blocks") if blocks else (len(graph.layers), "layers")
    if pp * vpp > units:
        asked = f"--pp {pp} x --vpp {vpp} = {pp * vpp} pipeline chunks" if vpp > 1 else f"--pp {pp}"
        raise ConstraintError(
            f"{asked} but the model has {units} {what}: every pipeline stage needs at least "
            f"one. Use a pipeline of at most {units} stages (pp * vpp <= {units}).")


def check_ep(graph: LayerGraph, training: TrainingSpec, pins: Pins) -> None:
    """Reject an expert-parallel degree the model or the pinned degrees cannot take
    (``pins.ep`` > 1; what the runtime lacks is :func:`check_runtime`'s)."""
    ep = pins.ep
    experts = common_expert_count(graph.layers)
    if experts is None:
        raise ConstraintError(f"--ep {ep}: the model has no mixture-of-experts layers to split; "
                              "leave --ep unset.")
    if experts % ep:
        raise ConstraintError(f"--ep {ep} does not divide the {experts} experts of each MoE "
                              "layer; pick a divisor of the expert count.")
    if pins.dp is not None and (pins.dp * (pins.cp or 1)) % ep:
        raise ConstraintError(
            f"--ep {ep} does not divide dp*cp = {pins.dp * (pins.cp or 1)}: expert-parallel "
            "ranks are carved out of the data-parallel replicas. Change --ep or --dp.")
    if RUNTIMES[training.runtime].ep_with_tp_needs_sp and pins.sp is False and (pins.tp or 1) > 1:
        raise ConstraintError(f"--ep {ep} with --tp {pins.tp} needs sequence parallelism in "
                              f"{RUNTIMES[training.runtime].name}; drop --no-sp (or pin --tp 1).")


def check_ep_cluster(cluster: Cluster, ep: int | None) -> None:
    """Expert parallelism is costed on clusters of one kind of node only."""
    if ep not in (None, 1) and not cluster.is_homogeneous:
        raise ConstraintError(
            f"--ep {ep}: expert parallelism is not modelled on a cluster of several node groups "
            "yet; leave --ep unset or plan on one node group.")
