"""Observers of the traced pass: which layer is running, and what each op means for TP.

``ProvenanceMode`` (a TorchFunctionMode) tags each tensor as TP-sharded or not by dataflow,
classifies every weight matmul column/row, records attention as attention (running SDPA as the
fused flash kernel, and recognising explicit ``matmul -> softmax -> matmul`` attention), and
counts the memory traffic of non-matmul ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from autoplan.graph.layer_graph import Attention, Experts, Gemm, TpSplit

MATMUL_FUNCS = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                torch.bmm, torch.Tensor.mm, torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm,
                torch.addmm,
                F.conv1d, F.conv2d, F.conv3d}
FLASH_BWD_RATIO = 2.5  # flash backward: five matmuls against the forward's two (FlopCounterMode)


def _lowers_to_mm(func, args, kwargs) -> bool:
    """A Linear without bias runs as ``aten.mm``; with a bias as ``aten.addmm``."""
    if func is not F.linear:
        return True
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return bias is None


def storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


@dataclass(frozen=True, slots=True)
class Weight:
    """A matrix some op multiplies activations by: a Linear's, HF's Conv1D's (stored
    transposed), one expert's slice of a fused expert tensor, or a router's."""

    name: str
    in_features: int
    out_features: int
    replicated: bool = False  # never TP-split (an MoE router): its output stays unsharded
    adapter_of: str | None = None  # a LoRA adapter: the name of its base Linear


@dataclass(frozen=True, slots=True)
class SacSave:
    """The output of an op torchtitan's selective (op-level) activation checkpointing saves:
    one of the compute-intensive ops (``torch._functorch.partitioners.get_default_op_list``:
    mm, addmm, bmm, flash/efficient SDPA, convolution), in forward order. ``alternating``: a
    bias-free Linear (``aten.mm``), of which torchtitan's policy recomputes every second one.
    ``partial``: a row-parallel Linear's output, which a TP rank holds whole (a partial sum
    before its reduce-scatter); the rest lies in a TP-sharded region."""

    nbytes: float
    alternating: bool
    partial: bool


@dataclass
class LayerStats:
    """What the observers accumulate for one layer of the chain during the traced pass."""

    saved_sharded: float = 0.0
    saved_replicated: float = 0.0
    attention_internal: float = 0.0
    traffic_sharded: float = 0.0
    traffic_replicated: float = 0.0
    gemms: dict[str, Gemm] = field(default_factory=dict)
    attention: list[Attention] = field(default_factory=list)
    experts: list[Experts] = field(default_factory=list)
    saved_storages: set[int] = field(default_factory=set)
    internal_storages: set[int] = field(default_factory=set)
    output_bytes: float = 0.0
    input_bytes: float = 0.0
    sac_saves: list[SacSave] = field(default_factory=list)
    column_inputs: dict[int, float] = field(default_factory=dict)  # storage -> bytes
    input_grad: bool = False  # an input tensor requires grad (a trainable parameter ran before)


@dataclass
class _ExplicitAttention:
    """An open ``q @ k^T`` whose ``probs @ v`` has not come yet."""

    q: torch.Tensor
    scores_shape: tuple[int, int]  # (query length, key length)
    keep: set[int]  # storages of q, k, v: saved as flash would; the rest in the window is s x s
    lineage: set[int] = field(default_factory=set)  # tensors computed from the scores
    masked: bool = False  # an (sq, sk) tensor from outside was applied: a causal mask


class Tracker:
    """Which layer is running now, and per-layer statistics."""

    def __init__(self, param_ids: set[int], param_storages: set[int]) -> None:
        self.current = ""
        self.stats: dict[str, LayerStats] = {}
        self.order: list[str] = []
        self.param_ids = param_ids
        self.param_storages = param_storages
        self.in_attention: tuple[set[int], LayerStats] | None = None
        self.provenance: ProvenanceMode | None = None

    def enter(self, name: str) -> LayerStats:
        """Attribute what runs from now on to layer segment ``name``."""
        self.current = name
        if name not in self.order:
            self.order.append(name)
        return self.now()

    def now(self) -> LayerStats:
        return self.stats.setdefault(self.current, LayerStats())

    def record_saved(self, t: torch.Tensor) -> None:
        """Count a tensor saved for backward once per storage; parameters are not activations;
        s x s tensors of explicit attention are left to the cost model's non-flash term."""
        storage, stats = storage_id(t), self.now()
        size = t.untyped_storage().nbytes()
        if storage in stats.internal_storages and self.in_attention is None:
            # An attention output a later op keeps too (the output projection's input): it
            # stays when selective recompute drops the attention internals.
            stats.internal_storages.discard(storage)
            stats.saved_storages.discard(storage)
            stats.attention_internal -= size
        if storage in stats.saved_storages or storage in self.param_storages:
            return
        stats.saved_storages.add(storage)
        if self.in_attention is not None and storage not in self.in_attention[0]:
            self.in_attention[1].attention_internal += size
            self.in_attention[1].internal_storages.add(storage)
        elif self.provenance is not None and self.provenance.is_score_tensor(t):
            return
        elif self.provenance is not None and self.provenance.is_sharded(t):
            stats.saved_sharded += size
        else:
            stats.saved_replicated += size


class ProvenanceMode(TorchFunctionMode):
    """Tags each tensor as TP-sharded or not by dataflow, classifies weight matmuls, records
    attention.

    A weight matmul reading an unsharded (residual-stream) tensor is column-parallel and its
    output is sharded; one reading a sharded tensor is row-parallel and its output is unsharded
    again (Megatron's pairing, Shoeybi et al. 2019). Any other op's output is sharded if an input
    is. Replicated weights (routers) neither split nor shard.
    """

    def __init__(self, tracker: Tracker, weights: dict[int, Weight]) -> None:
        super().__init__()
        self.tracker = tracker
        self.weights = weights
        self.sharded: dict[int, tuple[torch.Tensor, str | None]] = {}  # id -> (tensor, origin)
        self.running_sharded = False  # the op now running reads a sharded tensor
        self.explicit: _ExplicitAttention | None = None
        tracker.provenance = self

    def is_sharded(self, t: torch.Tensor) -> bool:
        """``t``, or the output of the op now running, lies in a TP-sharded region."""
        return (id(t) in self.sharded and self.sharded[id(t)][0] is t) or self.running_sharded

    def _tagged(self, t: torch.Tensor) -> bool:
        return id(t) in self.sharded and self.sharded[id(t)][0] is t

    def origin(self, t: torch.Tensor) -> str | None:
        return self.sharded[id(t)][1] if self._tagged(t) else None

    def _tag(self, tree: Any, origin: str | None) -> None:
        for t in tensors(tree):
            self.sharded[id(t)] = (t, origin)

    def is_score_tensor(self, t: torch.Tensor) -> bool:
        e = self.explicit
        return (e is not None and storage_id(t) not in e.keep and t.dim() >= 2
                and tuple(t.shape[-2:]) == e.scores_shape)

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        inputs = tensors((args, kwargs))
        weight = next((t for t in inputs if id(t) in self.weights), None)
        closing = False
        if func in MATMUL_FUNCS:
            closing = weight is None and self._watch_explicit_attention(func, args, kwargs)
            self.explicit = self.explicit if weight is None else None
        self.running_sharded = any(self._tagged(t) for t in inputs)
        out = func(*args, **kwargs)
        self.running_sharded = False
        if weight is not None and func in MATMUL_FUNCS:
            x = next(t for t in inputs if t is not weight and id(t) not in self.tracker.param_ids)
            self._weight_matmul(x, self.weights[id(weight)], out, wgrad=weight.requires_grad)
            self._sac_save(out, alternating=_lowers_to_mm(func, args, kwargs),
                           partial=self._tagged(x) and not self.weights[id(weight)].replicated)
            return out
        if func in MATMUL_FUNCS:
            self._sac_save(out, alternating=False, partial=False)  # bmm of explicit attention
        if closing:
            self._record_explicit()
        elif self.explicit is not None:
            self._follow_explicit(inputs, out)
        tagged = [t for t in inputs if self._tagged(t)]
        if tagged:
            self._tag(out, self.origin(tagged[0]))
        if func not in MATMUL_FUNCS:
            self._count_traffic(inputs, out, sharded=bool(tagged))
        return out

    def _dropout(self, x: torch.Tensor, p: float = 0.5, training: bool = True,
                 inplace: bool = False) -> torch.Tensor:
        """Run dropout as the GPU kernel does (a 1-byte mask saved), not as the CPU/meta
        decomposition that keeps a mask in the input's dtype."""
        if not training or p == 0.0:
            return x
        sharded = self._tagged(x)
        self.running_sharded = sharded
        out = torch.ops.aten.native_dropout(x, p, True)[0]
        self.running_sharded = False
        if sharded:
            self._tag(out, self.origin(x))
        self._count_traffic([x], out, sharded=sharded)
        return out

    def _weight_matmul(self, x: torch.Tensor, weight: Weight, out: torch.Tensor, *,
                       wgrad: bool) -> None:
        """Record the matmul as a Gemm: its TP split by dataflow (an adapter takes its base
        Linear's, which ran just before it), and which of its gradients backward computes."""
        stats = self.tracker.now()
        if weight.adapter_of is not None:
            base = stats.gemms.get(weight.adapter_of)
            split = base.split if base is not None else TpSplit.NONE
        elif weight.replicated:
            split = TpSplit.NONE
        else:
            split = TpSplit.ROW if self._tagged(x) else TpSplit.COLUMN
        previous = stats.gemms.get(weight.name)
        count = previous.count + 1 if previous else 1
        rows = x.numel() // weight.in_features
        stats.gemms[weight.name] = Gemm(weight.name, weight.in_features, weight.out_features,
                                        split, count, rows, wgrad=wgrad, dgrad=x.requires_grad,
                                        adapter=weight.adapter_of is not None)
        if split is TpSplit.COLUMN:
            self._tag(out, weight.name)
            stats.column_inputs[storage_id(x)] = float(x.untyped_storage().nbytes())

    def _sac_save(self, out: Any, *, alternating: bool, partial: bool) -> None:
        self.tracker.now().sac_saves.append(
            SacSave(float(sum(nbytes(t) for t in tensors(out))), alternating, partial))

    def _count_traffic(self, inputs: list[torch.Tensor], out: Any, *, sharded: bool) -> None:
        """Bytes a memory-bound op reads and writes (views and parameters move nothing)."""
        outputs = tensors(out)
        in_storages = {storage_id(t) for t in inputs}
        fresh = [t for t in outputs if storage_id(t) not in in_storages]
        if not fresh:
            return
        read = sum(nbytes(t) for t in inputs if id(t) not in self.tracker.param_ids)
        moved = read + sum(nbytes(t) for t in fresh)
        stats = self.tracker.now()
        if sharded:
            stats.traffic_sharded += moved
        else:
            stats.traffic_replicated += moved

    def _watch_explicit_attention(self, func, args, kwargs) -> bool:
        """An activation @ activation matmul opens attention (q @ k^T) or, when it reads the
        scores' descendant, closes it (probs @ v): then True."""
        if func in (torch.baddbmm, torch.Tensor.baddbmm):
            a, b = (*args[1:], kwargs.get("batch1"), kwargs.get("batch2"))[:2]
        else:
            a, b = (*args, None, None)[:2]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 3:
            return False
        e = self.explicit
        if e is not None and id(a) in e.lineage and tuple(a.shape[-2:]) == e.scores_shape:
            e.keep.add(storage_id(b))
            return True
        self.explicit = _ExplicitAttention(q=a, scores_shape=(a.shape[-2], b.shape[-1]),
                                           keep={storage_id(a), storage_id(b)})
        return False

    def _follow_explicit(self, inputs: list[torch.Tensor], out: Any) -> None:
        """Extend the scores' lineage; an outside (sq, sk) operand of it is a causal mask."""
        e = self.explicit
        if e.lineage and not any(id(t) in e.lineage for t in inputs):
            return
        outside = [t for t in inputs if id(t) not in e.lineage and t.dim() >= 2
                   and tuple(t.shape[-2:]) == e.scores_shape]
        e.masked |= bool(e.lineage) and bool(outside) and e.scores_shape[0] == e.scores_shape[1]
        e.lineage.update(id(t) for t in tensors(out))

    def _record_explicit(self) -> None:
        """Record ``softmax(q k^T) v`` as attention once its second matmul has run."""
        e, self.explicit = self.explicit, None
        sq, sk = e.scores_shape
        head_dim = e.q.shape[-1]
        heads = e.q.numel() // (sq * head_dim)  # batch 1 at trace time
        fwd = 2.0 * 2.0 * heads * sq * sk * head_dim
        self.tracker.now().attention.append(Attention(
            num_heads=heads, num_kv_heads=heads, head_dim=head_dim, seq_len=sq,
            causal=e.masked, dropout=0.0, fwd_flops=fwd, bwd_flops=FLASH_BWD_RATIO * fwd,
            backward=e.q.requires_grad))

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        """Record the call as attention and run it as the fused flash kernel."""
        heads, kv_heads, head_dim = q.shape[-3], k.shape[-3], q.shape[-1]
        kv_heads = self._true_kv_heads(q, k, heads, kv_heads, head_dim)
        if k.shape[-3] != heads:
            k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
            v = v.repeat_interleave(heads // v.shape[-3], dim=-3)
        stats = self.tracker.now()
        self.tracker.in_attention = ({storage_id(t) for t in (q, k, v)}, stats)
        with FlopCounterMode(display=False) as counter:
            if attn_mask is None:
                results = torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale)
            else:
                results = torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, attn_mask.expand(q.shape[0], heads, q.shape[-2], k.shape[-2]),
                    True, dropout_p, is_causal, scale=scale)
        self.tracker.in_attention = None
        out = results[0]
        # SAC keeps the kernel's output and its fp32 log-sum-exp (the tensor outputs)
        self._sac_save([t for t in results[:2] if isinstance(t, torch.Tensor)],
                       alternating=False, partial=False)
        fwd = float(counter.get_total_flops())
        stats.attention.append(Attention(
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, seq_len=q.shape[-2],
            causal=bool(is_causal), dropout=float(dropout_p), fwd_flops=fwd / q.shape[0],
            bwd_flops=FLASH_BWD_RATIO * fwd / q.shape[0],
            backward=any(t.requires_grad for t in (q, k, v))))
        self._tag(out, self.origin(q))
        return out

    def _true_kv_heads(self, q, k, heads: int, kv_heads: int, head_dim: int) -> int:
        """KV heads from the matmul that produced K (models often repeat K/V before SDPA)."""
        q_origin, k_origin = self.origin(q), self.origin(k)
        by_name = {w.name: w for w in self.weights.values()}
        if k_origin is None or k_origin not in by_name:
            return kv_heads
        out_features = by_name[k_origin].out_features
        if k_origin == q_origin:  # fused QKV: (heads + 2 * kv_heads) * head_dim
            fused = (out_features // head_dim - heads) // 2
            return fused if fused > 0 else kv_heads
        return max(1, out_features // head_dim)
