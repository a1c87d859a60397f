"""Trace a model on the meta device into a LayerGraph: no memory, no weights, one pass.

How (DESIGN.md, data flow step 1):

1. ``build_model()`` under ``torch.device("meta")``, cast to the training precision.
2. Find the chain (``blocks.py``): stacks of repeated blocks, traced once per distinct block
   and replayed otherwise, so tracing cost does not grow with depth; and the units between them.
   MoE modules are replaced by balanced routing (``moe.py``).
3. One forward and backward pass on meta inputs, under the meta device too (a bare
   ``torch.arange`` in forward stays meta), observed by:
   - ``FlopCounterMode``: FLOPs per module, forward (snapshot) and forward+backward;
   - ``saved_tensors_hooks``: bytes saved for backward, per layer, each storage once;
   - ``ProvenanceMode`` (``provenance.py``): TP split of every weight matmul by dataflow,
     attention recorded as attention, the memory traffic of non-matmul ops;
   - module hooks that say which layer of the chain is running.
4. Per-layer records and model dimensions (``assemble.py``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autoplan.errors import ModelFileError
from autoplan.graph.assemble import LOSS_SEGMENT, START_SEGMENT, TraceRun, build_graph
from autoplan.graph.blocks import Chain, find_chain, replay
from autoplan.graph.inputs import default_inputs
from autoplan.graph.layer_graph import LayerGraph
from autoplan.graph.loader import ModelSource, build_on_meta
from autoplan.graph.moe import find_moe, patch_moe
from autoplan.graph.no_compile import dynamo_left_unloaded
from autoplan.graph.provenance import ProvenanceMode, Tracker, Weight, nbytes, storage_id, tensors

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def matmul_weights(model: nn.Module) -> dict[int, Weight]:
    """Weights multiplied by activations: Linears, and HF's Conv1D (GPT-2), stored [in, out];
    PEFT's LoRA adapters know their base Linear."""
    weights = {}
    adapters = _lora_adapters(model)
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear):
            weights[id(weight)] = Weight(name, module.in_features, module.out_features,
                                         adapter_of=adapters.get(name))
        elif isinstance(weight, torch.Tensor) and weight.dim() == 2 and getattr(module, "nf", None) == weight.shape[1]:
            weights[id(weight)] = Weight(name, weight.shape[0], weight.shape[1])
    return weights


def _lora_adapters(model: nn.Module) -> dict[str, str]:
    """Adapter Linear -> its base Linear, for PEFT LoRA layers (a module with ``base_layer``
    and the ``lora_A``/``lora_B`` dictionaries of adapters, peft/tuners/lora/layer.py)."""
    adapters = {}
    for name, module in model.named_modules():
        if not all(isinstance(getattr(module, a, None), nn.ModuleDict) for a in ("lora_A", "lora_B")):
            continue
        if not isinstance(getattr(module, "base_layer", None), nn.Module):
            continue
        for part in ("lora_A", "lora_B"):
            for key in getattr(module, part):
                adapters[f"{name}.{part}.{key}"] = f"{name}.base_layer"
    return adapters


def _install_segment_hooks(tracker: Tracker, chain: Chain) -> list:
    """Module hooks that set the running layer. What runs after a stack's last block and
    before the next module (rarely anything) is a glue segment of its own."""
    last_blocks = {s.blocks[-1][0]: f"{s.name}:after" for s in chain.stacks}

    def enter(name):
        def hook(module, args, kwargs):
            first = name not in tracker.order
            stats = tracker.enter(name)
            if first:
                inputs = tensors((args, kwargs))
                stats.input_bytes = sum(nbytes(t) for t in inputs[:1])
                stats.input_grad = any(t.requires_grad for t in inputs)
        return hook

    def leave(name):
        def hook(module, args, kwargs, output):
            tracker.stats[name].output_bytes = sum(nbytes(t) for t in tensors(output)[:1])
            if name in last_blocks:
                tracker.enter(last_blocks[name])
        return hook

    modules = [*chain.units.items(), *(b for s in chain.stacks for b in s.blocks)]
    handles = []
    for name, module in modules:
        handles.append(module.register_forward_pre_hook(enter(name), with_kwargs=True))
        handles.append(module.register_forward_hook(leave(name), with_kwargs=True))
    return handles


def _prepare(model: nn.Module) -> tuple[Chain, dict[int, Weight], Tracker]:
    chain = find_chain(model)
    for stack in chain.stacks:
        replay(stack)
    weights = matmul_weights(model)
    tracker = Tracker({id(p) for p in model.parameters()},
                      {storage_id(p) for p in model.parameters()})
    for moe in find_moe(model):
        patch_moe(moe, weights, lambda record: tracker.now().experts.append(record))
    return chain, weights, tracker


def _run(source: ModelSource, *, seq_len: int, precision: str) -> TraceRun:
    model = build_on_meta(source).to(_DTYPES[precision])
    chain, weights, tracker = _prepare(model)
    handles = _install_segment_hooks(tracker, chain)

    def pack(t: torch.Tensor):
        tracker.record_saved(t)
        return t

    inputs = _example_inputs(source, model, seq_len, _DTYPES[precision])
    try:
        with dynamo_left_unloaded(), torch.device("meta"), \
                FlopCounterMode(display=False) as counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with ProvenanceMode(tracker, weights):
                    tracker.enter(START_SEGMENT)
                    output = _call(model, inputs)
                    tracker.enter(LOSS_SEGMENT).input_grad = any(
                        t.requires_grad for t in tensors(output))
                    loss = model_loss(source, output, inputs)
            flops_fwd = _per_module(counter)
            _check_trains(source, loss)
            loss.backward()
        flops_total = _per_module(counter)
    except ModelFileError:
        raise
    except Exception as err:
        raise _trace_error(source, err) from None
    finally:
        for handle in handles:
            handle.remove()
    return TraceRun(model, chain, tracker, flops_fwd, flops_total)


def _check_trains(source: ModelSource, loss: torch.Tensor) -> None:
    """A loss without a gradient means nothing trains: a planning question for inference."""
    if not loss.requires_grad:
        raise ModelFileError(
            f"{source.name}: no parameter requires grad, so nothing would be trained. Leave "
            "requires_grad=True on the parameters to train (PEFT's get_peft_model does this for "
            "its adapters), or use `autoplan infer` to place the model for inference.")


def _call(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def _trace_error(source: ModelSource, err: Exception) -> ModelFileError:
    """Say what to change: a real tensor made in forward, or value-dependent control flow."""
    text = f"{type(err).__name__}: {err}"
    if "device cpu" in text or "device type cpu" in text or "same device" in text:
        return ModelFileError(
            f"{source.name}: forward created a real (non-meta) tensor ({text[:200]}). Create "
            "tensors on the input's device (device=x.device) or with no device= argument, and "
            "load no weights, so that autoplan can trace without memory.")
    return ModelFileError(
        f"{source.name}: tracing forward/backward on the meta device failed with {text[:300]}. "
        "Models whose control flow depends on tensor values cannot be traced without data; "
        "make such branches depend on shapes or config.")


def _example_inputs(source: ModelSource, model: nn.Module, seq_len: int, dtype: torch.dtype) -> Any:
    """Meta inputs for one sample: model.py's ``example_inputs`` (a tensor, a tuple of positional
    inputs or a dict of keyword inputs), else built from forward's signature (``inputs.py``)."""
    with torch.device("meta"):
        if source.example_inputs is None:
            inputs = default_inputs(source.name, model, 1, seq_len)
        else:
            inputs = _user_inputs(source, seq_len)
    cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    if isinstance(inputs, dict):
        return {k: cast(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return tuple(cast(t) for t in inputs)
    return cast(inputs)


def _user_inputs(source: ModelSource, seq_len: int) -> Any:
    try:
        return source.example_inputs(1, seq_len)
    except Exception as err:
        raise ModelFileError(
            f"{source.name}: example_inputs(1, {seq_len}) raised {type(err).__name__}: {err}."
        ) from None


def model_loss(source: ModelSource, output: Any, inputs: Any) -> torch.Tensor:
    """model.py's ``loss(output, inputs)``, or the mean of the first output tensor."""
    if source.loss is not None:
        try:
            return source.loss(output, inputs)
        except Exception as err:
            raise ModelFileError(
                f"{source.name}: loss(output, inputs) raised {type(err).__name__}: {err}."
            ) from None
    found = tensors(getattr(output, "logits", None) if hasattr(output, "logits") else output)
    if not found:
        raise ModelFileError(
            f"{source.name}: the model returned no tensor; define loss(output, inputs) in "
            "model.py to turn its output into a scalar loss."
        )
    return found[0].float().mean()


def _per_module(counter: FlopCounterMode) -> dict[str, float]:
    return {name: float(sum(ops.values())) for name, ops in counter.get_flop_counts().items()}


def trace_model(source: ModelSource, *, seq_len: int, precision: str = "bf16") -> LayerGraph:
    """Trace model.py's model at ``seq_len`` into a LayerGraph (per-sample figures)."""
    start = time.perf_counter()
    run = _run(source, seq_len=seq_len, precision=precision)
    graph = build_graph(run, name=source.name, seq_len=seq_len)
    logger.info("traced %s in %.2fs", source.name, time.perf_counter() - start)
    return graph
