"""Trace a model on the meta device into a LayerGraph: no memory, no weights, one pass.

How (DESIGN.md, data flow step 1):

1. ``build_model()`` under ``torch.device("meta")``, cast to the training precision.
2. Find the repeated block (the largest ModuleList/Sequential of identical children). Block 0
   runs for real; blocks 1..L-1 are replayed (they return their input), so tracing cost does not
   grow with depth. Their statistics are block 0's.
3. One forward and backward pass on meta inputs under four observers:
   - ``FlopCounterMode``: FLOPs per module, forward (snapshot) and forward+backward;
   - ``saved_tensors_hooks``: bytes saved for backward, per layer, each storage once;
   - ``_ProvenanceMode`` (a TorchFunctionMode): TP classification of every Linear by dataflow,
     attention calls recorded as attention (and run as the fused flash kernel, which keeps no
     s x s matrix), and the memory traffic of non-matmul ops;
   - module hooks that say which layer of the chain is running.
"""

from __future__ import annotations

import contextlib
import logging
import time
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from autoplan.errors import ModelFileError
from autoplan.graph.layer_graph import Attention, Gemm, Layer, LayerGraph, LayerKind, ModelDims, TpSplit
from autoplan.graph.loader import ModelSource, build_on_meta

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_MATMUL_FUNCS = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                 torch.bmm, torch.Tensor.mm, torch.Tensor.bmm, torch.baddbmm, torch.addmm,
                 F.conv1d, F.conv2d, F.conv3d}
EMBEDDING_SEGMENT = "embedding"
LOSS_SEGMENT = "loss"


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


@dataclass
class _LayerStats:
    """What the observers accumulate for one layer of the chain during the traced pass."""

    saved_sharded: float = 0.0
    saved_replicated: float = 0.0
    attention_internal: float = 0.0
    traffic_sharded: float = 0.0
    traffic_replicated: float = 0.0
    gemms: dict[str, Gemm] = field(default_factory=dict)
    attention: list[Attention] = field(default_factory=list)
    saved_storages: set[int] = field(default_factory=set)
    internal_storages: set[int] = field(default_factory=set)
    output_bytes: float = 0.0
    input_bytes: float = 0.0


class _Tracker:
    """Which layer is running now, and per-layer statistics."""

    def __init__(self) -> None:
        self.current = EMBEDDING_SEGMENT
        self.stats: dict[str, _LayerStats] = {}
        self.param_ids: set[int] = set()
        self.param_storages: set[int] = set()
        self.blocks_started = False
        self.in_attention: tuple[set[int], _LayerStats] | None = None
        self.provenance: _ProvenanceMode | None = None

    def is_sharded(self, t: torch.Tensor) -> bool:
        """A tensor, or the output of the op now running, lies in a TP-sharded region."""
        p = self.provenance
        return p is not None and (p._is_sharded(t) or p.running_sharded)

    def now(self) -> _LayerStats:
        return self.stats.setdefault(self.current, _LayerStats())


class _ProvenanceMode(TorchFunctionMode):
    """Tags each tensor as TP-sharded or not by dataflow, classifies Linears, records attention.

    A Linear reading an unsharded (residual-stream) tensor is column-parallel and its output is
    sharded; a Linear reading a sharded tensor is row-parallel and its output is unsharded again
    (Megatron's pairing, Shoeybi et al. 2019). Any other op's output is sharded if an input is.
    """

    def __init__(self, tracker: _Tracker, linears: dict[int, tuple[str, nn.Linear]]) -> None:
        super().__init__()
        self.tracker = tracker
        self.linears = linears
        self.sharded: dict[int, tuple[torch.Tensor, str | None]] = {}  # id -> (tensor, origin)
        self.running_sharded = False  # the op now running reads a sharded tensor
        tracker.provenance = self

    def _is_sharded(self, t: torch.Tensor) -> bool:
        return id(t) in self.sharded and self.sharded[id(t)][0] is t

    def _origin(self, t: torch.Tensor) -> str | None:
        return self.sharded[id(t)][1] if self._is_sharded(t) else None

    def _tag(self, tree: Any, origin: str | None) -> None:
        for t in _tensors(tree):
            self.sharded[id(t)] = (t, origin)

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        self.running_sharded = any(self._is_sharded(t) for t in inputs)
        out = func(*args, **kwargs)
        self.running_sharded = False
        if func is F.linear and id(args[1]) in self.linears:
            self._linear(args[0], args[1], out)
            return out
        any_sharded = [t for t in inputs if self._is_sharded(t)]
        if any_sharded:
            self._tag(out, self._origin(any_sharded[0]))
        if func not in _MATMUL_FUNCS:
            self._count_traffic(inputs, out, sharded=bool(any_sharded))
        return out

    def _dropout(self, x: torch.Tensor, p: float = 0.5, training: bool = True,
                 inplace: bool = False) -> torch.Tensor:
        """Run dropout as the GPU kernel does (a 1-byte mask saved), not as the CPU/meta
        decomposition that keeps a mask in the input's dtype."""
        if not training or p == 0.0:
            return x
        self.running_sharded = self._is_sharded(x)
        out = torch.ops.aten.native_dropout(x, p, True)[0]
        self.running_sharded = False
        if self._is_sharded(x):
            self._tag(out, self._origin(x))
        self._count_traffic([x], out, sharded=self._is_sharded(x))
        return out

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        name, module = self.linears[id(weight)]
        split = TpSplit.ROW if self._is_sharded(x) else TpSplit.COLUMN
        stats = self.tracker.now()
        previous = stats.gemms.get(name)
        count = previous.count + 1 if previous else 1
        rows = x.numel() // module.in_features
        stats.gemms[name] = Gemm(name, module.in_features, module.out_features, split, count, rows)
        if split is TpSplit.COLUMN:
            self._tag(out, name)

    def _count_traffic(self, inputs: list[torch.Tensor], out: Any, *, sharded: bool) -> None:
        """Bytes a memory-bound op reads and writes (views and parameters move nothing)."""
        outputs = _tensors(out)
        in_storages = {_storage_id(t) for t in inputs}
        fresh = [t for t in outputs if _storage_id(t) not in in_storages]
        if not fresh:
            return
        read = sum(_nbytes(t) for t in inputs if id(t) not in self.tracker.param_ids)
        moved = read + sum(_nbytes(t) for t in fresh)
        stats = self.tracker.now()
        if sharded:
            stats.traffic_sharded += moved
        else:
            stats.traffic_replicated += moved

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        """Record the call as attention and run it as the fused flash kernel."""
        heads, kv_heads, head_dim = q.shape[-3], k.shape[-3], q.shape[-1]
        kv_heads = self._true_kv_heads(q, k, heads, kv_heads, head_dim)
        if k.shape[-3] != heads:
            k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
            v = v.repeat_interleave(heads // v.shape[-3], dim=-3)
        stats = self.tracker.now()
        self.tracker.in_attention = ({_storage_id(t) for t in (q, k, v)}, stats)
        with FlopCounterMode(display=False) as counter:
            if attn_mask is None:
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            else:
                out = torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, attn_mask.expand(q.shape[0], heads, q.shape[-2], k.shape[-2]),
                    True, dropout_p, is_causal, scale=scale)[0]
        self.tracker.in_attention = None
        fwd = float(counter.get_total_flops())
        stats.attention.append(Attention(
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, seq_len=q.shape[-2],
            causal=bool(is_causal), dropout=float(dropout_p), fwd_flops=fwd / q.shape[0],
            bwd_flops=2.5 * fwd / q.shape[0]))
        self._tag(out, self._origin(q))
        return out

    def _true_kv_heads(self, q, k, heads: int, kv_heads: int, head_dim: int) -> int:
        """KV heads from the Linear that produced K (models often repeat K/V before SDPA)."""
        q_origin, k_origin = self._origin(q), self._origin(k)
        linears = {name: m for name, m in self.linears.values()}
        if k_origin is None or k_origin not in linears:
            return kv_heads
        out_features = linears[k_origin].out_features
        if k_origin == q_origin:  # fused QKV: (heads + 2 * kv_heads) * head_dim
            fused = (out_features // head_dim - heads) // 2
            return fused if fused > 0 else kv_heads
        return max(1, out_features // head_dim)


def find_block_list(model: nn.Module) -> tuple[str, nn.ModuleList | nn.Sequential] | None:
    """The ModuleList/Sequential of identical blocks holding the most parameters, if any."""
    best, best_params = None, 0
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
            continue
        children = list(module)
        signature = [(type(c), tuple((n, tuple(p.shape)) for n, p in c.named_parameters()))
                     for c in children]
        if any(s != signature[0] for s in signature) or not signature[0][1]:
            continue
        params = sum(p.numel() for p in module.parameters())
        if params > best_params:
            best, best_params = (name, module), params
    return best


def _chain_units(model: nn.Module, blocks_name: str | None) -> list[tuple[str, nn.Module]]:
    """Modules that are layers of the chain besides the blocks: siblings along the path to the
    block list (or the top-level children when there is none)."""
    if blocks_name is None:
        return list(model.named_children())
    units, prefix, parent = [], "", model
    for part in blocks_name.split("."):
        for name, child in parent.named_children():
            if name != part:
                units.append((prefix + name, child))
        prefix, parent = f"{prefix}{part}.", getattr(parent, part)
    return units


def _replay(block: nn.Module) -> None:
    """Make a block return its input: the trace replicates block 0's statistics instead."""

    def forward(self, *args, **kwargs):
        hidden = args[0] if args else next(iter(kwargs.values()))
        return (hidden,) + self._autoplan_rest if self._autoplan_rest is not None else hidden

    block.forward = types.MethodType(forward, block)


@dataclass
class _TraceRun:
    model: nn.Module
    tracker: _Tracker
    flops_fwd: dict[str, float]
    flops_total: dict[str, float]
    order: list[str]
    unit_modules: dict[str, nn.Module]
    block_names: list[str]


def _install_segment_hooks(tracker: _Tracker, order: list[str], units: dict[str, nn.Module],
                           blocks: list[tuple[str, nn.Module]]) -> list:
    """Module hooks that set the running layer; ops after the last layer belong to the loss."""
    handles = []

    block_names = {n for n, _ in blocks}

    def enter(name):
        def hook(module, args, kwargs):
            tracker.current = name
            tracker.blocks_started |= name in block_names
            if name not in order:
                order.append(name)
                stats = tracker.now()
                stats.input_bytes = sum(_nbytes(t) for t in _tensors((args, kwargs))[:1])
        return hook

    def leave(name):
        def hook(module, args, kwargs, output):
            stats = tracker.stats[name]
            stats.output_bytes = sum(_nbytes(t) for t in _tensors(output)[:1])
            if name in units or (blocks and name == blocks[-1][0]):
                tracker.current = LOSS_SEGMENT if tracker.blocks_started or not blocks else EMBEDDING_SEGMENT
        return hook

    for name, module in [*units.items(), *blocks]:
        handles.append(module.register_forward_pre_hook(enter(name), with_kwargs=True))
        handles.append(module.register_forward_hook(leave(name), with_kwargs=True))
    return handles


def _run(source: ModelSource, *, seq_len: int, precision: str) -> _TraceRun:
    model = build_on_meta(source).to(_DTYPES[precision])
    found = find_block_list(model)
    blocks = [(f"{found[0]}.{i}", b) for i, b in enumerate(found[1])] if found else []
    units = {n: m for n, m in _chain_units(model, found[0] if found else None)}
    for name, block in blocks[1:]:
        _replay(block)
    tracker = _Tracker()
    tracker.param_ids = {id(p) for p in model.parameters()}
    tracker.param_storages = {_storage_id(p) for p in model.parameters()}
    order: list[str] = []
    handles = _install_segment_hooks(tracker, order, units, blocks)
    if blocks:
        _capture_block_output_structure(blocks)
    linears = {id(m.weight): (n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)}

    def pack(t: torch.Tensor):
        _record_saved(tracker, t)
        return t

    inputs = _example_inputs(source, seq_len, _DTYPES[precision])
    try:
        with FlopCounterMode(display=False) as counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with _ProvenanceMode(tracker, linears):
                    output = model(*inputs) if isinstance(inputs, tuple) else model(inputs)
                    tracker.current = LOSS_SEGMENT
                    loss = _loss(source, output, inputs)
            flops_fwd = _per_module(counter)
            loss.backward()
        flops_total = _per_module(counter)
    except ModelFileError:
        raise
    except Exception as err:
        raise ModelFileError(
            f"{source.name}: tracing forward/backward on the meta device failed with "
            f"{type(err).__name__}: {err}. Models whose control flow depends on tensor values "
            "cannot be traced without data; make such branches depend on shapes or config."
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    return _TraceRun(model, tracker, flops_fwd, flops_total, order, units,
                     [n for n, _ in blocks])


def _capture_block_output_structure(blocks: list[tuple[str, nn.Module]]) -> None:
    """Replayed blocks must return what block 0 returns (a tensor or a tuple around it)."""
    first = blocks[0][1]

    def remember(module, args, output):
        rest = tuple(output[1:]) if isinstance(output, tuple) else None
        for _, block in blocks[1:]:
            block._autoplan_rest = rest

    first.register_forward_hook(remember)


def _record_saved(tracker: _Tracker, t: torch.Tensor) -> None:
    """Count a tensor saved for backward once per storage; parameters are not activations."""
    storage = _storage_id(t)
    stats = tracker.now()
    nbytes = t.untyped_storage().nbytes()
    if storage in stats.internal_storages and tracker.in_attention is None:
        # An attention output that a later op keeps too (the output projection's input):
        # it stays when selective recompute drops the attention internals.
        stats.internal_storages.discard(storage)
        stats.attention_internal -= nbytes
        stats.saved_storages.discard(storage)
    if storage in stats.saved_storages or storage in tracker.param_storages:
        return
    if tracker.in_attention is not None:
        qkv_storages, attention_stats = tracker.in_attention
        if storage not in qkv_storages:
            stats.saved_storages.add(storage)
            stats.internal_storages.add(storage)
            attention_stats.attention_internal += nbytes
            return
    stats.saved_storages.add(storage)
    if tracker.is_sharded(t):
        stats.saved_sharded += nbytes
    else:
        stats.saved_replicated += nbytes


def _example_inputs(source: ModelSource, seq_len: int, dtype: torch.dtype) -> Any:
    with torch.device("meta"):
        if source.example_inputs is None:
            return torch.zeros(1, seq_len, dtype=torch.long)
        try:
            inputs = source.example_inputs(1, seq_len)
        except Exception as err:
            raise ModelFileError(
                f"{source.name}: example_inputs(1, {seq_len}) raised {type(err).__name__}: {err}."
            ) from None
    cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    if isinstance(inputs, (tuple, list)):
        return tuple(cast(t) for t in inputs)
    return cast(inputs)


def _loss(source: ModelSource, output: Any, inputs: Any) -> torch.Tensor:
    if source.loss is not None:
        try:
            return source.loss(output, inputs)
        except Exception as err:
            raise ModelFileError(
                f"{source.name}: loss(output, inputs) raised {type(err).__name__}: {err}."
            ) from None
    tensors = _tensors(getattr(output, "logits", output))
    if not tensors:
        raise ModelFileError(
            f"{source.name}: the model returned no tensor; define loss(output, inputs) in "
            "model.py to turn its output into a scalar loss."
        )
    return tensors[0].float().mean()


def _per_module(counter: FlopCounterMode) -> dict[str, float]:
    return {name: float(sum(ops.values())) for name, ops in counter.get_flop_counts().items()}


def _params(modules: list[nn.Module], seen: set[int]) -> tuple[int, int, int]:
    """(params, bytes, tied params) of modules; parameters seen earlier in the chain count as
    tied, not again."""
    count = nbytes = tied = 0
    for module in modules:
        for p in module.parameters():
            if id(p) in seen:
                tied += p.numel()
                continue
            seen.add(id(p))
            count += p.numel()
            nbytes += _nbytes(p)
    return count, nbytes, tied


def _sharded_params(modules: list[nn.Module], gemms: dict[str, Gemm], vocab: int | None,
                    named: dict[str, nn.Module]) -> int:
    """Parameters TP splits: paired Linears (column bias too) and vocab-sized tables. Gemm names
    are block 0's; identical blocks have identical Linears."""
    sharded = 0
    for gemm in gemms.values():
        linear = named[gemm.name]
        if not isinstance(linear, nn.Linear):
            continue
        if gemm.split is TpSplit.NONE:
            continue
        sharded += linear.weight.numel()
        if linear.bias is not None and gemm.split is TpSplit.COLUMN:
            sharded += linear.bias.numel()
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, nn.Embedding) and sub.num_embeddings == vocab:
                sharded += sub.weight.numel()
    return sharded


def _kind_of(name: str, modules: list[nn.Module], is_block: bool, position: str) -> LayerKind:
    if is_block:
        return LayerKind.BLOCK
    if position == "pre":
        return LayerKind.EMBEDDING if any(isinstance(m, nn.Embedding) for mod in modules
                                          for m in mod.modules()) else LayerKind.MODULE
    if name == LOSS_SEGMENT:
        return LayerKind.LOSS
    if any(isinstance(m, nn.Linear) for mod in modules for m in mod.modules()):
        return LayerKind.HEAD
    if any("norm" in type(m).__name__.lower() for mod in modules for m in mod.modules()):
        return LayerKind.NORM
    return LayerKind.MODULE


def _vocab_size(run: _TraceRun) -> int | None:
    tables = [m.num_embeddings for m in run.model.modules() if isinstance(m, nn.Embedding)]
    return max(tables) if tables else None


def _group_chain(run: _TraceRun) -> list[tuple[str, list[str], str]]:
    """The chain as (layer name, member segment names, position) in execution order; a
    block's statistics are block 0's (the others were replayed)."""
    order = [n for n in run.order]
    if not run.block_names:
        chain = [(n, [n], "unit") for n in order]
        if chain:
            chain[0] = (chain[0][0], [EMBEDDING_SEGMENT, *chain[0][1]], "unit")
        return chain + [(LOSS_SEGMENT, [LOSS_SEGMENT], "post")]
    first = order.index(run.block_names[0])
    pre = order[:first]
    post = [n for n in order[first:] if n not in run.block_names]
    chain = [(EMBEDDING_SEGMENT, [EMBEDDING_SEGMENT, *pre], "pre")]
    chain += [(n, [run.block_names[0]], "block") for n in run.block_names]
    chain += [(n, [n], "post") for n in post]
    return chain + [(LOSS_SEGMENT, [LOSS_SEGMENT], "post")]


def _merged(run: _TraceRun, members: list[str]) -> _LayerStats:
    merged = _LayerStats()
    parts = [run.tracker.stats[m] for m in members if m in run.tracker.stats]
    for part in parts:
        for attr in ("saved_sharded", "saved_replicated", "attention_internal",
                     "traffic_sharded", "traffic_replicated"):
            setattr(merged, attr, getattr(merged, attr) + getattr(part, attr))
        merged.gemms.update(part.gemms)
        merged.attention.extend(part.attention)
    if parts:
        merged.input_bytes = next((p.input_bytes for p in parts if p.input_bytes), 0.0)
        merged.output_bytes = next((p.output_bytes for p in reversed(parts) if p.output_bytes), 0.0)
    return merged


def _flops(run: _TraceRun, members: list[str], root: str) -> tuple[float, float]:
    keys = [f"{root}.{m}" for m in members if m not in (EMBEDDING_SEGMENT, LOSS_SEGMENT)]
    fwd = sum(run.flops_fwd.get(k, 0.0) for k in keys)
    total = sum(run.flops_total.get(k, 0.0) for k in keys)
    return fwd, total - fwd


def _layers(run: _TraceRun) -> list[Layer]:
    root = type(run.model).__name__
    named = dict(run.model.named_modules())
    vocab = _vocab_size(run)
    seen: set[int] = set()
    layers = []
    for name, members, position in _group_chain(run):
        modules = [named[m] for m in ([name] if position == "block" else members) if m in named]
        stats = _merged(run, members)
        count, nbytes, tied = _params(modules, seen)
        fwd, bwd = _flops(run, members, root)
        kind = _kind_of(name, modules, position == "block", position)
        gemms = dict(stats.gemms)
        if kind is LayerKind.HEAD:  # the LM head is vocab-parallel (column) in Megatron
            gemms = {k: Gemm(g.name, g.in_features, g.out_features, TpSplit.COLUMN, g.count,
                             g.rows) for k, g in gemms.items()}
        layers.append(Layer(
            name=name, kind=kind, num_params=count,
            params_sharded=min(count, _sharded_params(modules, gemms, vocab, named)),
            param_bytes=nbytes, fwd_flops=fwd, bwd_flops=bwd,
            activation_bytes_sharded=stats.saved_sharded,
            activation_bytes_replicated=stats.saved_replicated,
            attention_internal_bytes=stats.attention_internal,
            elementwise_bytes_sharded=stats.traffic_sharded,
            elementwise_bytes_replicated=stats.traffic_replicated,
            boundary_bytes=stats.output_bytes, input_bytes=stats.input_bytes,
            gemms=tuple(gemms.values()), attention=tuple(stats.attention),
            tp_allreduces=sum(g.count for g in gemms.values() if g.split is TpSplit.ROW)
            + (1 if kind is LayerKind.EMBEDDING and vocab else 0),
            tied_params=tied,
        ))
    return _fix_loss(run, layers, root)


def _fix_loss(run: _TraceRun, layers: list[Layer], root: str) -> list[Layer]:
    """FLOPs outside every layer's module (the loss, a bare matmul in forward) go to the loss."""
    counted_fwd = sum(l.fwd_flops for l in layers if l.kind is not LayerKind.BLOCK)
    counted_total = counted_fwd + sum(l.bwd_flops for l in layers if l.kind is not LayerKind.BLOCK)
    block = next((l for l in layers if l.kind is LayerKind.BLOCK), None)
    if block is not None:  # only block 0 ran
        counted_fwd += block.fwd_flops
        counted_total += block.fwd_flops + block.bwd_flops
    extra_fwd = run.flops_fwd.get("Global", 0.0) - counted_fwd
    extra_bwd = run.flops_total.get("Global", 0.0) - counted_total - extra_fwd
    loss = layers[-1]
    fixed = Layer(**{**{f: getattr(loss, f) for f in Layer.__slots__},
                     "fwd_flops": loss.fwd_flops + max(0.0, extra_fwd),
                     "bwd_flops": loss.bwd_flops + max(0.0, extra_bwd)})
    return [*layers[:-1], fixed]


def _dims(layers: list[Layer], seq_len: int, vocab: int | None) -> ModelDims | None:
    blocks = [l for l in layers if l.kind is LayerKind.BLOCK]
    if not blocks or not blocks[0].attention:
        return None
    block, attention = blocks[0], blocks[0].attention[0]
    hidden = attention.num_heads * attention.head_dim
    columns = [g for g in block.gemms if g.split is TpSplit.COLUMN]
    ffn = max((g.out_features for g in columns), default=4 * hidden)
    head = next((l for l in layers if l.kind is LayerKind.HEAD), None)
    embedding = layers[0]
    return ModelDims(
        hidden_size=hidden,
        num_layers=len(blocks), num_heads=attention.num_heads,
        num_kv_heads=attention.num_kv_heads, ffn_hidden_size=ffn,
        vocab_size=vocab or 0, seq_len=seq_len,
        gated_mlp=sum(1 for g in columns if g.out_features == ffn) >= 2,
        rmsnorm=False, rotary=False,
        tied_embeddings=bool(head and head.tied_params),
        linear_bias=True,
    ) if embedding else None


def trace_model(source: ModelSource, *, seq_len: int, precision: str = "bf16") -> LayerGraph:
    """Trace model.py's model at ``seq_len`` into a LayerGraph (per-sample figures)."""
    start = time.perf_counter()
    run = _run(source, seq_len=seq_len, precision=precision)
    layers = _layers(run)
    dims = _dims(layers, seq_len, _vocab_size(run))
    dims = _refine_dims(run, dims) if dims else None
    divisors = tuple(sorted({dims.num_heads, dims.num_kv_heads})) if dims else ()
    logger.info("traced %s in %.2fs", source.name, time.perf_counter() - start)
    return LayerGraph(name=source.name, layers=tuple(layers), seq_len=seq_len, dims=dims,
                      tp_divisors=divisors)


def _refine_dims(run: _TraceRun, dims: ModelDims) -> ModelDims:
    """Facts read from modules rather than dataflow: norm type, position table, biases."""
    block = dict(run.model.named_modules())[run.block_names[0]]
    norms = [m for m in block.modules() if "norm" in type(m).__name__.lower()]
    rmsnorm = bool(norms) and not any(isinstance(m, nn.LayerNorm) for m in norms)
    tables = [m for m in run.model.modules() if isinstance(m, nn.Embedding)]
    linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
    return ModelDims(**{
        **{f: getattr(dims, f) for f in ModelDims.__slots__},
        "rmsnorm": rmsnorm, "rotary": len(tables) == 1,
        "linear_bias": any(m.bias is not None for m in linears),
    })
