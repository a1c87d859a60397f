"""The plans of a heterogeneous cluster: which node group runs which pipeline stages.

A plan keeps one (tp, pp, dp) for all stages (Megatron and torchrun need that) and puts each
stage's tp*dp*cp GPUs inside one node group. Its candidates are
    shapes      (tp, pp, dp, mbs), cp = 1, vpp = 1: tp a TP degree of the model that some
                group's nodes can hold, pp and dp drawn like ``space.shapes`` (dp: the two
                largest degrees that leave room for pp stages, or every degree for objectives
                that reward fewer GPUs)
    switches    as ``space.switches`` (partial recompute only when pinned)
    assignments the groups along the pipeline: distinct groups in some order, each running a
                contiguous run of k_g >= 1 stages with k_g*tp*dp <= its GPUs, sum k_g = pp (the
                order matters: the first stage holds the most micro-batches in flight)
    blocks      every split of the blocks into pp stages of at least one block each where the
                blocks are all alike (``space.uniform_blocks``; the partition model chooses
                among them), else the menu of ``space.stage_variants``; the layers before
                the first block join stage 0, those after the last the final stage.
Both the search (``hetero``) and the brute-force reference (``brute``) draw from here.
"""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.cluster.spec import Cluster
from autoplan.graph.layer_graph import LayerGraph
from autoplan.plan import Plan, Stage
from autoplan.search.space import (
    MAX_MICRO_BATCH, Shape, Switches, block_counts, compositions, divisors, make_plan, pp_options,
    stage_variants, switches, tp_options, uniform_blocks,
)
from autoplan.training import Bounds, Pins, TrainingSpec

Assignment = tuple[tuple[str, int], ...]
"""(group name, stages it runs) in pipeline order."""


def hosts(group: Cluster, graph: LayerGraph, tp: int, pins: Pins) -> bool:
    """Whether a group's nodes can hold a TP group of ``tp`` (the TP rule of ``space``)."""
    return tp in tp_options(graph, group.gpus_per_node, pins.tp)


def capacity(cluster: Cluster, graph: LayerGraph, tp: int, dp: int, pins: Pins) -> dict[str, int]:
    """Stages of tp*dp GPUs each group can run, fastest GPUs first (the order assignments are
    generated in: under a deadline, plans on fast GPUs are met first)."""
    ranked = sorted(cluster.groups, key=lambda g: -g.gpu.peak_flops("bf16"))
    return {g.name: g.num_gpus // (tp * dp) for g in ranked if hosts(g, graph, tp, pins)}


def group_shapes(graph: LayerGraph, cluster: Cluster, training: TrainingSpec, pins: Pins,
                 bounds: Bounds | None = None, max_gpus: int | None = None,
                 every_dp: bool = False) -> list[Shape]:
    """All legal (tp, pp, dp, mbs) of the space above, within ``bounds`` and ``max_gpus``."""
    world = min(cluster.num_gpus, max_gpus or cluster.num_gpus)
    tps = sorted({t for g in cluster.groups for t in tp_options(graph, g.gpus_per_node, pins.tp)})
    batch, out = training.global_batch, []
    for tp in tps:
        for pp in pp_options(graph, world // tp, pins.pp):
            dps = [d for d in divisors(batch) if tp * pp * d <= world
                   and sum(capacity(cluster, graph, tp, d, pins).values()) >= pp
                   and (pins.dp is None or d == pins.dp)]
            for dp in dps if every_dp else dps[-2:]:
                for mbs in divisors(batch // dp):
                    if mbs <= MAX_MICRO_BATCH and pins.mbs in (None, mbs) and pins.vpp in (None, 1):
                        out.append(Shape(tp, pp, dp, 1, mbs, 1))
    if bounds is not None:
        out = [s for s in out if bounds.admits(tp=s.tp, pp=s.pp, dp=s.dp, mbs=s.mbs, vpp=1)]
    return out


def assignments(capacities: dict[str, int], pp: int) -> Iterator[Assignment]:
    """Every ordered run of distinct groups with 1 <= k_g <= capacity stages summing to pp
    (depth first, groups in cluster order; a branch stops when the groups left cannot hold
    the stages left)."""
    names = [n for n, k in capacities.items() if k]

    def extend(done: Assignment, left: int) -> Iterator[Assignment]:
        if left == 0:
            yield done
            return
        unused = [n for n in names if all(n != g for g, _ in done)]
        if sum(capacities[n] for n in unused) < left:
            return
        for name in unused:
            for k in range(1, min(capacities[name], left) + 1):
                yield from extend(done + ((name, k),), left - k)

    return extend((), pp)


def stage_groups(assignment: Assignment) -> tuple[str, ...]:
    """The group of each stage in pipeline order."""
    return tuple(name for name, k in assignment for _ in range(k))


def shape_switches(shape: Shape, training: TrainingSpec, pins: Pins) -> list[Switches]:
    return switches(shape, runtime=training.runtime, pins=pins)


def block_stages(graph: LayerGraph, blocks: tuple[int, ...],
                 groups: tuple[str, ...]) -> tuple[Stage, ...]:
    """Stages holding ``blocks[i]`` blocks each, on ``groups[i]``."""
    starts = graph.block_indices()
    stages, used, end = [], 0, len(graph.layers)
    for i, (count, group) in enumerate(zip(blocks, groups)):
        first = 0 if i == 0 else starts[used]
        used += count
        last = end if i == len(blocks) - 1 else starts[used]
        stages.append(Stage(first_layer=first, num_layers=last - first, group=group))
    return tuple(stages)


def group_plan(shape: Shape, sw: Switches, graph: LayerGraph, blocks: tuple[int, ...],
               assignment: Assignment, training: TrainingSpec) -> Plan:
    return make_plan(shape, sw, block_stages(graph, blocks, stage_groups(assignment)), training)


def group_candidates(graph: LayerGraph, cluster: Cluster, training: TrainingSpec, pins: Pins,
                     bounds: Bounds | None = None, max_gpus: int | None = None,
                     every_dp: bool = False) -> Iterator[Plan]:
    """Every plan of the space (a generator; exponential in pp: for references and tests)."""
    for shape in group_shapes(graph, cluster, training, pins, bounds, max_gpus, every_dp):
        caps = capacity(cluster, graph, shape.tp, shape.dp, pins)
        for assignment in assignments(caps, shape.pp):
            for sw in shape_switches(shape, training, pins):
                for blocks in block_splits(graph, shape.pp):
                    yield group_plan(shape, sw, graph, blocks, assignment, training)


def block_splits(graph: LayerGraph, pp: int) -> list[tuple[int, ...]]:
    """The blocks per stage a plan of ``pp`` stages may have (the space above), in order."""
    if uniform_blocks(graph):
        return list(compositions(len(graph.block_indices()), pp))
    return [block_counts(graph, stages) for stages in stage_variants(graph, pp, 1)]
