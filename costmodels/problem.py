"""The problem an estimate is of (model graph, cluster, training, profiles, memory limit), its
layer classes, and the memo of derived costs kept beside it (not in the frozen record)."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, fields, replace

from autoplan.costmodels.profiles import ComputeProfile, RuntimeProfile, compute_profile

from autoplan.cluster.spec import Cluster
from autoplan.graph.layer_graph import Layer, LayerGraph
from autoplan.training import AttentionKernel, TrainingSpec


@dataclass(frozen=True)
class Problem:
    """Everything an estimate depends on besides the plan."""

    graph: LayerGraph
    cluster: Cluster
    training: TrainingSpec
    runtime: RuntimeProfile
    compute: ComputeProfile
    mem_limit_bytes: float
    headroom: float = 0.0
    """Fraction of each GPU's memory kept free (``mem_limit_bytes`` already has it)."""

    def __post_init__(self) -> None:
        classes: dict[tuple, int] = {}
        index = [classes.setdefault(layer_key(l), len(classes)) for l in self.graph.layers]
        firsts = {c: index.index(c) for c in range(len(classes))}
        prefix = [[0] * (len(index) + 1) for _ in classes]
        for i, c in enumerate(index):
            for k in range(len(classes)):
                prefix[k][i + 1] = prefix[k][i] + (c == k)
        object.__setattr__(self, "_classes", [self.graph.layers[firsts[c]] for c in range(len(classes))])
        object.__setattr__(self, "_prefix", prefix)

    def layer_counts(self, first: int, num: int) -> tuple[tuple[int, int], ...]:
        """(class id, how many) of each distinct layer in ``layers[first:first+num]``; equal
        layers (the replicated blocks) share a class."""
        key = ("counts", first, num)
        counts = memo(self).get(key)
        if counts is None:
            end = first + num
            counts = tuple((c, p[end] - p[first]) for c, p in enumerate(self._prefix)
                           if p[end] - p[first])
            memo(self)[key] = counts
        return counts

    def layer_class(self, class_id: int) -> Layer:
        return self._classes[class_id]

    def on_group(self, name: str) -> "Problem":
        """The problem on one node group of a heterogeneous cluster: its GPU and links, its
        GPU's compute profile (the given one where the group has the cluster's first GPU), and
        the memory limit capped at its GPU's memory less the headroom. Its layers drop their names, so equal
        blocks share one class and a stage's costs depend on how many blocks it has, not which."""
        key = ("on_group", name)
        sub = memo(self).get(key)
        if sub is None:
            group = next(g for g in self.cluster.groups if g.name == name)
            compute = (self.compute if group.gpu == self.cluster.gpu
                       else compute_profile(group.gpu.name))
            sub = memo(self)[key] = Problem(
                _unnamed(self.graph), group, self.training, self.runtime, compute,
                min(self.mem_limit_bytes, group.gpu.memory_bytes * (1 - self.headroom)),
                self.headroom)
        return sub

    @property
    def precision(self) -> str:
        return self.training.precision.value

    @property
    def flash_attention(self) -> bool:
        return self.training.attention is AttentionKernel.FLASH


def _unnamed(graph: LayerGraph) -> LayerGraph:
    """The graph with layer and module names dropped (they cost nothing)."""
    return replace(graph, layers=tuple(replace(l, name="", modules=()) for l in graph.layers))


_IDENTITY_FIELDS = ("name", "modules")
"""Fields that name a layer without changing its costs: equal blocks share one class."""


def layer_key(layer: Layer) -> tuple:
    return tuple(getattr(layer, f.name) for f in fields(Layer) if f.name not in _IDENTITY_FIELDS)


MIB = 2**20


def memory_mib(peak_bytes: float) -> int:
    """Worst-GPU memory rounded up to whole MiB: the unit in which plans are compared."""
    return math.ceil(peak_bytes / MIB)


def limit_mib(problem: Problem) -> int:
    """The memory limit rounded down to whole MiB."""
    return int(problem.mem_limit_bytes // MIB)


_MEMOS: dict[int, dict] = {}


def memo(problem: Problem) -> dict:
    """The memo of what has been derived from ``problem`` (layer costs, links, rank sums): kept
    beside the frozen record rather than in it, so a changed copy (``dataclasses.replace``)
    starts with an empty one, and dropped with the problem."""
    table = _MEMOS.get(id(problem))
    if table is None:
        table = _MEMOS[id(problem)] = {}
        weakref.finalize(problem, _MEMOS.pop, id(problem), None)
    return table
