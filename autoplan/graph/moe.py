"""Mixture-of-experts layers: recognise them, and trace them as balanced routing.

Routing depends on token values (``nonzero``, ``where`` over the router's choices), which meta
tensors do not have; HF's loop over "experts hit" silently runs zero experts on meta. So a
recognised MoE module's forward is replaced, for the trace, by what balanced routing costs: the
router's matmul, then one expert run on ``tokens * top_k`` rows (all experts together do exactly
that work and save exactly those activations), weighted and summed back per token, plus any
shared experts. Recognised shapes:

- a router: a Linear, or a module holding one ``[num_experts, hidden]`` weight (HF v5);
- experts: a ModuleList of ``num_experts`` identical modules, or a module whose parameters are
  all ``[num_experts, out, in]`` tensors (HF v5 fused experts: gate/up then down).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.graph.layer_graph import Experts
from autoplan.graph.provenance import Weight

TOP_K_NAMES = ("top_k", "num_experts_per_tok", "topk", "moe_top_k", "k")


@dataclass(frozen=True)
class MoeModule:
    """A recognised MoE module: its router weight and its experts."""

    name: str
    module: nn.Module
    router_name: str
    router: nn.Module
    experts_name: str
    experts: nn.Module
    num_experts: int
    top_k: int

    def record(self, tokens: int) -> Experts:
        per_expert = sum(p.numel() for p in self.experts.parameters()) // self.num_experts
        return Experts(name=self.experts_name, num_experts=self.num_experts, top_k=self.top_k,
                       params_per_expert=per_expert,
                       tokens_per_expert=tokens * self.top_k / self.num_experts,
                       router=self.router_name)


def _router_weight(module: nn.Module) -> torch.Tensor | None:
    params = list(module.parameters())
    if isinstance(module, nn.Linear) or (len(params) == 1 and params[0].dim() == 2):
        return module.weight if hasattr(module, "weight") else params[0]
    return None


def _num_experts(module: nn.Module) -> int | None:
    """Experts held by ``module``: a list of identical modules, or fused 3-D tensors."""
    if isinstance(module, nn.ModuleList) and len(module) > 1:
        shapes = {tuple((n, tuple(p.shape)) for n, p in c.named_parameters()) for c in module}
        return len(module) if len(shapes) == 1 and next(iter(shapes)) else None
    params = list(module.parameters(recurse=False))
    leading = {p.shape[0] for p in params if p.dim() == 3}
    if params and len(leading) == 1 and all(p.dim() == 3 for p in params):
        return leading.pop()
    return None


def _top_k(*modules: nn.Module) -> int:
    for module in modules:
        for attr in TOP_K_NAMES:
            value = getattr(module, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        config = getattr(module, "config", None)
        value = getattr(config, "num_experts_per_tok", None)
        if isinstance(value, int):
            return value
    return 1


def find_moe(model: nn.Module) -> list[MoeModule]:
    """MoE modules of ``model``: a child router whose output width is a sibling's expert count."""
    found = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        experts = {n: (c, _num_experts(c)) for n, c in children.items()}
        for router_name, router in children.items():
            weight = _router_weight(router)
            if weight is None:
                continue
            match = [n for n, (_, e) in experts.items() if e == weight.shape[0] and n != router_name]
            if match:
                found.append(MoeModule(
                    f"{name}", module, f"{name}.{router_name}".lstrip("."), router,
                    f"{name}.{match[0]}".lstrip("."), children[match[0]], weight.shape[0],
                    _top_k(module, router, children[match[0]])))
                break
    return found


def _expert_fn(moe: MoeModule, weights: dict[int, Weight]) -> Callable:
    """One expert as a function of its routed rows; fused weights are registered as matmuls."""
    if isinstance(moe.experts, nn.ModuleList):
        return moe.experts[0]
    named = list(moe.experts.named_parameters(recurse=False))
    views = [p[0] for _, p in named]
    for (pname, _), view in zip(named, views):
        weights[id(view)] = Weight(f"{moe.experts_name}.{pname}", view.shape[1], view.shape[0])
    *ups, down = views

    def expert(x: torch.Tensor) -> torch.Tensor:
        if len(ups) == 2:
            hidden = F.silu(F.linear(x, ups[0])) * F.linear(x, ups[1])
        elif ups[0].shape[0] == 2 * down.shape[1]:
            gate, up = F.linear(x, ups[0]).chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(F.linear(x, ups[0]))
        return F.linear(hidden, down)

    expert._views = views  # the registered views must outlive the trace (weights holds ids)
    return expert


def patch_moe(moe: MoeModule, weights: dict[int, Weight], on_call: Callable[[Experts], None]) -> None:
    """Replace ``moe.module``'s forward by balanced routing (see the module docstring)."""
    router_weight = _router_weight(moe.router)
    weights[id(router_weight)] = Weight(moe.router_name, router_weight.shape[1],
                                        router_weight.shape[0], replicated=True)
    expert = _expert_fn(moe, weights)
    shared = [c for c in moe.module.children() if c is not moe.router and c is not moe.experts]
    returns_tuple = "tuple" in str(inspect.signature(type(moe.module).forward).return_annotation)
    bias = getattr(moe.router, "bias", None)

    def forward(self, hidden: torch.Tensor, *args, **kwargs):
        flat = hidden.reshape(-1, hidden.shape[-1])
        logits = F.linear(flat, router_weight, bias)
        top, _ = torch.topk(logits.softmax(dim=-1), moe.top_k, dim=-1)
        out = expert(flat.repeat_interleave(moe.top_k, dim=0)).view(-1, moe.top_k, flat.shape[-1])
        out = (out * top[..., None].to(out.dtype)).sum(dim=1)
        for module in shared:
            extra = module(flat)
            out = out + extra if extra.shape == out.shape else out * torch.sigmoid(extra)
        on_call(moe.record(flat.shape[0]))
        out = out.view(hidden.shape)
        return (out, logits) if returns_tuple else out

    moe.module.forward = types.MethodType(forward, moe.module)
