"""Find the chain of a model: its stacks of repeated blocks and the modules between them.

A *stack* is a ModuleList/Sequential of same-type blocks most of which are identical (T5's first
block alone carries the relative position table; a ResNet stage's first block downsamples),
whatever the attribute is called (``h``, ``layers``, ``encoder.block``...). Models may have
several (encoder and decoder). The first block of each distinct shape runs for real; the others
are *replayed*: they return their input, and reuse that block's statistics, so tracing time does
not grow with depth. Blocks that differ in what trains are not identical: which of their
parameters require grad, and whether their input does (a trainable parameter runs before them),
decide what their backward computes and saves. Everything else is a *unit*: a module outside every stack that is a layer
of its own (embeddings, final norm, head). A model with no stack is a chain of its top-level
modules, the largest split into their children so that a pipeline has somewhere to cut.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass

from torch import nn

MIN_STACK_SHARE = 0.05  # besides the largest, a stack holds this share of the parameters (not a
# pair of norms); the largest always counts (tiny blocks under a big vocabulary table)
MAX_UNIT_SHARE = 0.25  # without stacks, units holding more than this are split into children


@dataclass(frozen=True)
class Stack:
    """One stack of blocks; ``traced_as[i]`` names the block whose statistics block i reuses."""

    name: str
    blocks: tuple[tuple[str, nn.Module], ...]
    traced_as: tuple[str, ...]


@dataclass(frozen=True)
class Chain:
    """The stacks and the units of a model, by qualified module name."""

    stacks: tuple[Stack, ...]
    units: dict[str, nn.Module]

    def block_names(self) -> dict[str, str]:
        """Every block's name mapped to the name of the block it is traced as."""
        return {n: t for s in self.stacks for (n, _), t in zip(s.blocks, s.traced_as)}


class _GradFlow:
    """Whether a module's input requires grad: some trainable parameter is registered before
    its own (registration order standing for execution order, as in a chain of blocks)."""

    def __init__(self, model: nn.Module) -> None:
        self.index = {id(p): i for i, p in enumerate(model.parameters())}
        self.first_trainable = min((self.index[id(p)] for p in model.parameters()
                                    if p.requires_grad), default=len(self.index))

    def input_requires_grad(self, module: nn.Module) -> bool:
        first = min((self.index[id(p)] for p in module.parameters()), default=len(self.index))
        return self.first_trainable < first


def _signature(module: nn.Module, flow: _GradFlow) -> tuple:
    params = tuple((n, tuple(p.shape), p.requires_grad) for n, p in module.named_parameters())
    return type(module), params, flow.input_requires_grad(module)


def _as_stack(name: str, module: nn.Module, flow: _GradFlow) -> Stack | None:
    """``module`` as a stack, if it is a list of same-type blocks, mostly identical."""
    if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
        return None
    children = list(module)
    signatures = [_signature(c, flow) for c in children]
    shapes = Counter((s[0], tuple(p[:2] for p in s[1])) for s in signatures)
    common, count = shapes.most_common(1)[0]
    if (len({s[0] for s in signatures}) > 1 or count < 2 or 2 * count < len(children)
            or not common[1]):
        return None
    first_of: dict[tuple, str] = {}
    blocks = tuple((f"{name}.{i}", c) for i, c in enumerate(children))
    traced_as = tuple(first_of.setdefault(s, n) for (n, _), s in zip(blocks, signatures))
    return Stack(name, blocks, traced_as)


def find_stacks(model: nn.Module) -> list[Stack]:
    """The outermost stacks of ``model`` in definition order."""
    candidates: list[Stack] = []
    flow = _GradFlow(model)
    for name, module in model.named_modules():
        if any(name.startswith(f"{s.name}.") for s in candidates):
            continue
        stack = _as_stack(name, module, flow)
        if stack is not None:
            candidates.append(stack)
    size = {s.name: sum(p.numel() for _, b in s.blocks for p in b.parameters()) for s in candidates}
    total = sum(p.numel() for p in model.parameters())
    largest = max(size.values(), default=0)
    return [s for s in candidates if size[s.name] == largest or size[s.name] >= MIN_STACK_SHARE * total]


def find_chain(model: nn.Module) -> Chain:
    """Stacks and units of ``model``; each module appears once even if shared (tied)."""
    stacks = find_stacks(model)
    stack_names = {s.name for s in stacks}
    units: dict[str, nn.Module] = {}
    seen: set[int] = set()

    def walk(prefix: str, parent: nn.Module) -> None:
        for name, child in parent.named_children():
            full = f"{prefix}{name}"
            if id(child) in seen:
                continue
            seen.add(id(child))
            if full in stack_names:
                continue
            if any(s.startswith(f"{full}.") for s in stack_names):
                walk(f"{full}.", child)
            else:
                units[full] = child

    walk("", model)
    if not stacks:
        units = _split_large(units, sum(p.numel() for p in model.parameters()))
    return Chain(tuple(stacks), units)


def _split_large(units: dict[str, nn.Module], total: int) -> dict[str, nn.Module]:
    """Replace units holding over MAX_UNIT_SHARE of the parameters by their children, in order,
    until none is left or the big ones are leaves."""
    out: dict[str, nn.Module] = {}
    for name, module in units.items():
        params = sum(p.numel() for p in module.parameters())
        children = dict(module.named_children())
        if params > MAX_UNIT_SHARE * total and len(children) > 1:
            out.update(_split_large({f"{name}.{n}": c for n, c in children.items()}, total))
        else:
            out[name] = module
    return out


def replay(stack: Stack) -> None:
    """Make the replayed blocks of ``stack`` return their input, shaped like their traced twin's
    output (a tensor, or a tuple whose other entries are the twin's)."""
    twins = dict(stack.blocks)
    for (name, block), traced_as in zip(stack.blocks, stack.traced_as):
        if name == traced_as:
            continue
        twin = twins[traced_as]

        def forward(self, *args, _twin=twin, **kwargs):
            hidden = args[0] if args else next(iter(kwargs.values()))
            rest = getattr(_twin, "_autoplan_rest", None)
            return (hidden, *rest) if rest is not None else hidden

        block.forward = types.MethodType(forward, block)
    for traced in {twins[t] for t in stack.traced_as}:
        traced.register_forward_hook(_remember_rest)


def _remember_rest(module: nn.Module, args, output) -> None:
    module._autoplan_rest = tuple(output[1:]) if isinstance(output, tuple) else None
