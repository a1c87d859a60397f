"""Turn what a traced pass observed into the LayerGraph's layers and model dimensions.

The chain is laid out in execution order: everything before the first stack is one
``embedding`` layer; each block is a layer (a replayed block carries its traced twin's
statistics); every other unit is a layer; a glue segment (ops after a stack, outside any module)
joins the next non-block layer; what runs after the model returns is the ``loss`` layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from autoplan.graph.blocks import Chain
from autoplan.graph.layer_graph import (
    Gemm, Layer, LayerGraph, LayerKind, LoraSpec, ModelDims, OpSacBytes, TpSplit,
)
from autoplan.graph.provenance import LayerStats, SacSave, Tracker

START_SEGMENT = "<start>"
LOSS_SEGMENT = "loss"
EMBEDDING_LAYER = "embedding"
_SUMMED = ("saved_sharded", "saved_replicated", "attention_internal", "traffic_sharded",
           "traffic_replicated")


@dataclass
class TraceRun:
    """What one traced pass observed (``trace.py``), the input of the assembly."""

    model: nn.Module
    chain: Chain
    tracker: Tracker
    flops_fwd: dict[str, float]
    flops_total: dict[str, float]


def group_chain(run: TraceRun) -> list[tuple[str, list[str], str]]:
    """The chain as (layer name, member segments, position) with position one of ``pre``,
    ``block``, ``between`` (units among stacks), ``post`` (after the last stack), ``unit`` (a
    model without stacks)."""
    blocks = run.chain.block_names()
    order = [s for s in run.tracker.order if s != LOSS_SEGMENT]
    block_positions = [i for i, s in enumerate(order) if s in blocks]
    if not block_positions:
        chain = [(s, [s], "unit") for s in order if s in run.chain.units]
        if chain:
            chain[0] = (chain[0][0], [START_SEGMENT, *chain[0][1]], "unit")
        return chain + [(LOSS_SEGMENT, [LOSS_SEGMENT], "post")]
    first, last = block_positions[0], block_positions[-1]
    chain = [(EMBEDDING_LAYER, order[:first], "pre")]
    glue: list[str] = []
    for i, segment in enumerate(order[first:], start=first):
        if segment in blocks:
            chain.append((segment, [blocks[segment]], "block"))
        elif segment in run.chain.units:
            chain.append((segment, [*glue, segment], "post" if i > last else "between"))
            glue = []
        else:
            glue.append(segment)
    return chain + [(LOSS_SEGMENT, [*glue, LOSS_SEGMENT], "post")]


def _merged(run: TraceRun, members: list[str]) -> LayerStats:
    merged = LayerStats()
    parts = [run.tracker.stats[m] for m in members if m in run.tracker.stats]
    for part in parts:
        for attr in _SUMMED:
            setattr(merged, attr, getattr(merged, attr) + getattr(part, attr))
        merged.gemms.update(part.gemms)
        merged.attention.extend(part.attention)
        merged.experts.extend(part.experts)
        merged.sac_saves.extend(part.sac_saves)
        merged.column_inputs.update(part.column_inputs)
    if parts:
        merged.input_bytes = next((p.input_bytes for p in parts if p.input_bytes), 0.0)
        merged.output_bytes = next((p.output_bytes for p in reversed(parts) if p.output_bytes), 0.0)
    return merged


def _params(modules: list[nn.Module], seen: set[int]) -> tuple[int, int, int, int]:
    """(params, bytes, tied params, frozen params) of modules; parameters seen earlier in the
    chain count as tied, not again; frozen ones have requires_grad=False."""
    count = nbytes = tied = frozen = 0
    for module in modules:
        for p in module.parameters():
            if id(p) in seen:
                tied += p.numel()
                continue
            seen.add(id(p))
            count += p.numel()
            nbytes += p.numel() * p.element_size()
            frozen += 0 if p.requires_grad else p.numel()
    return count, nbytes, tied, frozen


def _param_modules(modules: list[nn.Module], seen: set[int]) -> tuple[int, int]:
    """(how many, largest) of the submodules that own parameters not seen earlier in the chain,
    counting only their own (DeepSpeed ZeRO-3 gathers and frees each such module's parameters
    around its forward and backward; its estimators call the largest one the "largest layer")."""
    sizes = [sum(p.numel() for p in m.parameters(recurse=False) if id(p) not in seen)
             for module in modules for m in module.modules()]
    sizes = [n for n in sizes if n]
    return len(sizes), max(sizes, default=0)


def _sharded_params(modules: list[nn.Module], stats: LayerStats, gemms: dict[str, Gemm],
                    vocab: int | None, named: dict[str, nn.Module], *,
                    frozen: bool = False) -> int:
    """Parameters TP splits: paired weight matmuls (column bias too), all experts (expert
    tensor parallelism), and vocab-sized tables; with ``frozen``, only those that do not
    require grad. Gemm names are the traced block's; identical blocks have identical weights
    (and the same parameters trainable)."""
    counted = lambda p: p is not None and (not frozen or not p.requires_grad)
    experts = [e.name for e in stats.experts]
    sharded = sum(e.num_experts * e.params_per_expert for e in stats.experts
                  if not frozen or not any(p.requires_grad for p in named[e.name].parameters()))
    for gemm in gemms.values():
        module = named.get(gemm.name)
        if module is None or gemm.split is TpSplit.NONE or any(
                gemm.name.startswith(f"{e}.") for e in experts):
            continue
        sharded += module.weight.numel() if counted(module.weight) else 0
        bias = getattr(module, "bias", None)
        if counted(bias) and gemm.split is TpSplit.COLUMN:
            sharded += bias.numel()
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, nn.Embedding) and sub.num_embeddings == vocab and counted(sub.weight):
                sharded += sub.weight.numel()
    return sharded


def _contains(modules: list[nn.Module], predicate) -> bool:
    return any(predicate(m) for module in modules for m in module.modules())


def _kind_of(name: str, modules: list[nn.Module], position: str) -> LayerKind:
    if position == "block":
        return LayerKind.BLOCK
    if name == LOSS_SEGMENT:
        return LayerKind.LOSS
    if position == "pre":
        return LayerKind.EMBEDDING if _contains(modules, lambda m: isinstance(m, nn.Embedding)) \
            else LayerKind.MODULE
    if position == "between":
        return LayerKind.MODULE
    if _contains(modules, lambda m: isinstance(m, nn.Linear)):
        return LayerKind.HEAD
    if _contains(modules, lambda m: "norm" in type(m).__name__.lower()):
        return LayerKind.NORM
    return LayerKind.MODULE


def _vocab_size(model: nn.Module) -> int | None:
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    return max(tables) if tables else None


def _flops(run: TraceRun, keys: list[str]) -> tuple[float, float]:
    fwd = sum(run.flops_fwd.get(k, 0.0) for k in keys)
    total = sum(run.flops_total.get(k, 0.0) for k in keys)
    return fwd, total - fwd


def _layer(run: TraceRun, name: str, members: list[str], position: str, *, seen: set[int],
           named: dict[str, nn.Module], vocab: int | None, root: str) -> Layer:
    module_names = tuple(m for m in ([name] if position == "block" else members) if m in named)
    modules = [named[m] for m in module_names]
    stats = _merged(run, members)
    param_modules, largest_module = _param_modules(modules, seen)
    count, nbytes, tied, frozen = _params(modules, seen)
    fwd, bwd = _flops(run, [f"{root}.{m}" for m in members if m in named])
    kind = _kind_of(name, modules, position)
    gemms = dict(stats.gemms)
    if kind is LayerKind.HEAD:  # the LM head is vocab-parallel (column) in Megatron
        gemms = {k: replace(g, split=TpSplit.COLUMN) for k, g in gemms.items()}
    sharded = min(count, _sharded_params(modules, stats, gemms, vocab, named))
    return Layer(
        name=name, kind=kind, num_params=count, params_sharded=sharded,
        frozen_params=frozen,
        frozen_sharded=min(frozen, sharded, _sharded_params(modules, stats, gemms, vocab, named,
                                                            frozen=True)),
        in_backward=bool(count > frozen or stats.input_grad or bwd > 0
                         or stats.saved_sharded + stats.saved_replicated),
        param_bytes=nbytes, fwd_flops=fwd, bwd_flops=bwd,
        activation_bytes_sharded=stats.saved_sharded,
        activation_bytes_replicated=stats.saved_replicated,
        attention_internal_bytes=stats.attention_internal,
        elementwise_bytes_sharded=stats.traffic_sharded,
        elementwise_bytes_replicated=stats.traffic_replicated,
        boundary_bytes=stats.output_bytes, input_bytes=stats.input_bytes,
        gemms=tuple(gemms.values()), attention=tuple(stats.attention),
        tp_allreduces=sum(g.count for g in gemms.values()
                          if g.split is TpSplit.ROW and not g.adapter)
        + (1 if kind is LayerKind.EMBEDDING and vocab else 0),
        tied_params=tied, experts=tuple(stats.experts), modules=module_names,
        param_modules=param_modules, largest_module_params=largest_module,
        op_sac_bytes=_op_sac_bytes(stats.sac_saves) if kind is LayerKind.BLOCK else None,
        column_input_bytes=sum(stats.column_inputs.values()),
    )


def _op_sac_bytes(saves: list[SacSave]) -> OpSacBytes:
    """Saved op outputs of a block under torchtitan's SAC policy, which counts ``aten.mm``
    calls within each forward of the block (a fresh count per checkpointed call) and
    recomputes those whose count is even: its first, third, fifth... mm outputs are saved,
    with every other compute-intensive op's (torchtitan activation_checkpoint.py,
    ``_get_custom_policy``)."""
    sharded = partial = 0.0
    count = 0
    for save in saves:
        count += save.alternating
        if save.alternating and count % 2 == 0:
            continue
        if save.partial:
            partial += save.nbytes
        else:
            sharded += save.nbytes
    return OpSacBytes(sharded, partial)


def _layers(run: TraceRun) -> list[Layer]:
    root = type(run.model).__name__
    named = dict(run.model.named_modules())
    vocab = _vocab_size(run.model)
    seen: set[int] = set()
    layers, counted = [], set()
    for name, members, position in group_chain(run):
        layers.append(_layer(run, name, members, position, seen=seen, named=named, vocab=vocab,
                             root=root))
        counted.update(f"{root}.{m}" for m in members if m in named)
    return _with_uncounted_flops(run, layers, counted)


def _with_uncounted_flops(run: TraceRun, layers: list[Layer], counted: set[str]) -> list[Layer]:
    """FLOPs outside every layer's module (the loss, a bare matmul in forward) go to the loss."""
    fwd, bwd = _flops(run, sorted(counted))
    total_fwd, total_bwd = _flops(run, ["Global"])
    loss = layers[-1]
    fixed = Layer(**{**{f: getattr(loss, f) for f in Layer.__slots__},
                     "fwd_flops": loss.fwd_flops + max(0.0, total_fwd - fwd),
                     "bwd_flops": loss.bwd_flops + max(0.0, total_bwd - bwd)})
    return [*layers[:-1], fixed]


def _dims(run: TraceRun, layers: list[Layer], seq_len: int) -> ModelDims | None:
    """Shape facts from the first block: attention heads, the MLP width (the widest row-split
    input), norms, biases, position table."""
    block = next((l for l in layers if l.kind is LayerKind.BLOCK and l.attention), None)
    if block is None:
        return None
    attention = block.attention[0]
    columns = [g for g in block.gemms if g.split is TpSplit.COLUMN]
    rows = [g for g in block.gemms if g.split is TpSplit.ROW]
    hidden = columns[0].in_features if columns else attention.num_heads * attention.head_dim
    ffn = max((g.in_features for g in rows), default=4 * hidden)
    module = dict(run.model.named_modules())[block.name]
    norms = [m for m in module.modules() if "norm" in type(m).__name__.lower()]
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    tables = [m for m in run.model.modules() if isinstance(m, nn.Embedding)]
    head = next((l for l in layers if l.kind is LayerKind.HEAD), None)
    theta, scaling, factor = _rope(run.model) if len(tables) == 1 else (None, None, None)
    return ModelDims(
        hidden_size=hidden, num_layers=sum(l.kind is LayerKind.BLOCK for l in layers),
        num_heads=attention.num_heads, num_kv_heads=attention.num_kv_heads,
        ffn_hidden_size=ffn, vocab_size=_vocab_size(run.model) or 0, seq_len=seq_len,
        gated_mlp=any(g.out_features == 2 * ffn for g in columns)
        or sum(g.out_features == ffn for g in columns) >= 2,
        rmsnorm=bool(norms) and not any(isinstance(m, nn.LayerNorm) for m in norms),
        rotary=len(tables) == 1, tied_embeddings=bool(head and head.tied_params),
        linear_bias=any(m.bias is not None for m in linears),
        rope_theta=theta, rope_scaling_type=scaling, rope_scaling_factor=factor,
        norm_eps=_norm_eps(norms),
    )


def _norm_eps(norms: list[nn.Module]) -> float | None:
    """The epsilon of the first norm: ``eps`` (torch's LayerNorm/RMSNorm, the zoo's) or
    ``variance_epsilon`` (Hugging Face's RMSNorm); None for torch's RMSNorm default."""
    for norm in norms:
        for name in ("eps", "variance_epsilon"):
            value = getattr(norm, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def _rope(model: nn.Module) -> tuple[float | None, str | None, float | None]:
    """(base, scaling type, scaling factor) of rotary positions as the model's configuration
    states them: a Hugging Face ``config`` (``rope_theta``/``rope_scaling``, or transformers
    5's ``rope_parameters``) or a ``cfg``/``config`` with ``rope_theta`` (the zoo's Llama)."""
    for module in model.modules():
        for holder in (getattr(module, "config", None), getattr(module, "cfg", None)):
            params = getattr(holder, "rope_parameters", None) or {}
            scaling = getattr(holder, "rope_scaling", None) or params
            theta = getattr(holder, "rope_theta", None) or params.get("rope_theta")
            if theta is None:
                continue
            kind = scaling.get("rope_type") or scaling.get("type") if scaling else None
            factor = scaling.get("factor") if scaling and kind not in (None, "default") else None
            return (float(theta), None if kind == "default" else kind,
                    float(factor) if factor is not None else None)
    return None, None, None


def lora_spec(model: nn.Module) -> LoraSpec | None:
    """The active LoRA adapter of a PEFT model (``peft_config[active_adapter]``: ``r``,
    ``lora_alpha``, ``lora_dropout``) and the Linears that carry it (modules with
    ``lora_A``/``lora_B`` dictionaries, peft/tuners/lora/layer.py); None for other models."""
    configs = getattr(model, "peft_config", None)
    active = getattr(model, "active_adapter", None)
    config = configs.get(active) if isinstance(configs, dict) and isinstance(active, str) else None
    if config is None or not hasattr(config, "lora_alpha"):
        return None
    targets = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                      if isinstance(getattr(module, "lora_A", None), nn.ModuleDict)
                      and active in module.lora_A})
    return LoraSpec(rank=int(config.r), alpha=float(config.lora_alpha),
                    dropout=float(config.lora_dropout), targets=tuple(targets))


def build_graph(run: TraceRun, *, name: str, seq_len: int) -> LayerGraph:
    layers = _layers(run)
    dims = _dims(run, layers, seq_len)
    divisors = tuple(sorted({dims.num_heads, dims.num_kv_heads})) if dims else ()
    return LayerGraph(name=name, layers=tuple(layers), seq_len=seq_len, dims=dims,
                      tp_divisors=divisors, lora=lora_spec(run.model))
