"""Run a contiguous slice of the traced layer chain of an unmodified model.py model.

The LayerGraph chain is ``embedding, block 0 .. block L-1, post units (final norm, head), loss``
and the plan's stages index it. A user's ``forward`` is arbitrary code, so a stage cannot be cut
out of it; instead every stage keeps the whole module tree, with the modules it does not own
moved to the meta device, and runs the whole ``forward``:

* layers before the stage run on meta tensors (free), and a forward pre-hook on the stage's first
  layer replaces the meta activation by the one received from the previous stage;
* a pre-hook on the layer after the stage raises :class:`_StageOutput` with its input, which ends
  the forward there (a stage holding the head returns the model output itself).

Sequence parallelism (Korthikanti et al. 2022) covers the blocks: block 0 takes its input's
sequence shard and the last block gathers its output, so tensors passed between two blocks, and
between pipeline stages cut between blocks, are sequence shards.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from autoplan.graph.layer_graph import LayerGraph

EMBEDDING, LOSS = "embedding", "loss"


class _StageOutput(Exception):
    """Raised by the pre-hook of the layer after a stage, carrying the stage's output."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value


@dataclass(frozen=True, slots=True)
class Chain:
    """The layer names of the traced chain (module names of ``model``, except the first and
    last) and which of them are blocks."""

    names: tuple[str, ...]
    blocks: tuple[int, ...]  # chain indices of the blocks
    embedding_modules: tuple[str, ...] = ()  # the modules the embedding layer is made of

    @classmethod
    def of(cls, graph: LayerGraph) -> "Chain":
        names = tuple(layer.name for layer in graph.layers)
        if names[0] != EMBEDDING or names[-1] != LOSS or not graph.block_indices():
            raise ValueError(f"{graph.name}: the traced chain {names} has no embedding, blocks "
                             "and loss; only transformer-style models can be split here.")
        return cls(names, tuple(graph.block_indices()), graph.layers[0].modules)

    def block_prefix(self) -> str:
        """Module path prefix of block 0 (``h.0.`` for ``h.0``)."""
        return self.names[self.blocks[0]] + "."

    def is_sequence_sharded(self, boundary: int) -> bool:
        """Whether the tensor passed from layer ``boundary - 1`` to ``boundary`` is a sequence
        shard under sequence parallelism (both sides are blocks)."""
        return boundary - 1 in self.blocks and boundary in self.blocks


def _owned_modules(model: nn.Module, chain: Chain, first: int, last: int,
                   pre_units: list[str]) -> set[str]:
    names = set()
    for index in range(first, last + 1):
        name = chain.names[index]
        if name == EMBEDDING:
            names.update(pre_units)
        elif name != LOSS:
            names.add(name)
    return names


def pre_units(model: nn.Module, chain: Chain) -> list[str]:
    """The modules the embedding layer of the chain is made of (as the trace recorded them)."""
    return list(chain.embedding_modules)


def _to_meta(module: nn.Module) -> None:
    """Replace a module's own parameters and buffers by meta tensors, leaving tied copies held
    by other modules real."""
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            setattr(sub, name, nn.Parameter(torch.empty_like(param, device="meta"),
                                            requires_grad=param.requires_grad))
        for name, buf in list(sub.named_buffers(recurse=False)):
            sub.register_buffer(name, torch.empty_like(buf, device="meta"))


class StageModule(nn.Module):
    """Layers ``first..last`` of the chain of a copy of ``model``; see the module docstring."""

    def __init__(self, model: nn.Module, chain: Chain, first: int, last: int, *,
                 sample_shape: tuple[int, ...], sequence_parallel: bool = False,
                 shard_sequence=None, gather_sequence=None) -> None:
        super().__init__()
        self.model = copy.deepcopy(model)
        self.chain, self.first, self.last = chain, first, last
        self.sample_shape = sample_shape  # token ids of one micro-batch
        units = pre_units(self.model, chain)
        owned = _owned_modules(self.model, chain, first, last, units)
        self.owned = sorted(owned)
        named = dict(self.model.named_modules())
        for name in [*units, *chain.names[1:-1]]:
            if name not in owned:
                _to_meta(named[name])
        self._inject: torch.Tensor | None = None
        self._sequence = (shard_sequence, gather_sequence) if sequence_parallel else None

    def install_hooks(self) -> None:
        """Register the injection, stop and sequence-parallel hooks; call it after wrapping
        blocks (activation checkpointing) so that the hooks sit outside the recomputed part."""
        chain, first, last = self.chain, self.first, self.last
        named = dict(self.model.named_modules())
        if first > 0 and chain.names[first] != LOSS:
            named[chain.names[first]].register_forward_pre_hook(self._inject_hook)
        first_block, last_block = chain.blocks[0], chain.blocks[-1]
        if self._sequence is not None and first <= first_block <= last:
            shard = self._sequence[0]
            named[chain.names[first_block]].register_forward_pre_hook(
                lambda _m, args: (shard(args[0]), *args[1:]))
        if self._sequence is not None and first <= last_block <= last:
            gather = self._sequence[1]
            named[chain.names[last_block]].register_forward_hook(
                lambda _m, _args, out: gather(out))
        if last + 1 < len(chain.names) - 1:
            named[chain.names[last + 1]].register_forward_pre_hook(self._stop_hook)

    def _inject_hook(self, _module, args):
        value, self._inject = self._inject, None
        return (value, *args[1:])

    @staticmethod
    def _stop_hook(_module, args):
        raise _StageOutput(args[0])

    def owned_modules(self) -> list[tuple[str, nn.Module]]:
        """(name, module) of the chain units this stage runs for real."""
        named = dict(self.model.named_modules())
        return [(name, named[name]) for name in self.owned]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chain.names[self.first] == LOSS:
            return x  # the schedule's loss function is this stage's work
        if self.first == 0:
            tokens = x
        else:
            tokens = torch.zeros((x.shape[0], *self.sample_shape[1:]), dtype=torch.long,
                                 device="meta")
            self._inject = x
        try:
            return self.model(tokens)
        except _StageOutput as out:
            return out.value
