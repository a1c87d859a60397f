"""HBM bytes of the memory-bound kernels of torchtitan's Llama block, eager and torch.compile'd.

torchtitan compiles each TransformerBlock (``apply_compile`` in torchtitan 9dec370, the commit
of its December 2024 H100 benchmark: ``torch.compile(transformer_block, fullgraph=True)``;
the loss and output layer stay eager). What Inductor changes in a block is the element-wise
work: matmuls and SDPA stay the same library kernels. This script runs the block of that
commit (copied below from torchtitan/models/llama/model.py and norms.py ``RMSNorm``, shapes
in Llama 3 8B's proportions scaled down) on CPU in bf16, forward and backward, and counts:
- eager: every aten op PyTorch dispatches (TorchDispatchMode) other than matmuls, attention,
  views and allocations, each op reading its inputs and writing its outputs once;
- compiled: Inductor's own byte count of each kernel it generates for the same forward and
  backward graphs (``GraphLowering.count_bytes``: ``get_read_write_buffers_sizes`` of every
  scheduler node), library kernels (matmuls, attention) left out, the ops Inductor cannot generate
  and falls back to ATen for (rotary's complex multiply) counted.
The ratio is what ``fsdp``'s ``compiled_elementwise_fraction`` states (costmodels/profiles.yaml).
Inductor's CPU and GPU backends share the scheduler that decides fusion, so the fused kernels'
reads and writes are those a GPU run makes; the block runs without activation checkpointing
(its recompute repeats the same kernels). Measured with torch 2.13: eager forward 76.5 and
backward 160.1 bf16 hidden vectors per token, compiled 34.5 + 52.1: 0.366. Takes a few minutes
(Inductor compiles C++).

    .venv/bin/python benchmarks/compiled_traffic.py
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

DIM, HEADS, KV_HEADS, FFN, SEQ = 1024, 8, 2, 3584, 256  # 8B: 4096, 32, 8, 14336
NOT_MEMORY_BOUND = {"mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu",
                    "_scaled_dot_product_flash_attention_for_cpu_backward"}
MOVE_NOTHING = {"detach", "t", "view", "_unsafe_view", "transpose", "expand", "permute",
                "unsqueeze", "squeeze", "slice", "select", "split", "alias", "as_strided",
                "unbind", "split_with_sizes", "reshape", "view_as_real", "view_as_complex",
                "_reshape_alias", "empty_like", "zeros_like", "ones_like", "empty",
                "new_empty_strided", "new_empty", "zeros", "arange", "lift_fresh", "_conj"}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x.float()).type_as(x) * self.weight


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (torch.unsqueeze(x, dim=3).expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)

    def attention(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        keys, values = repeat_kv(xk, HEADS // KV_HEADS), repeat_kv(xv, HEADS // KV_HEADS)
        output = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2),
                                                values.transpose(1, 2), is_causal=True)
        return self.wo(output.transpose(1, 2).contiguous().view(bs, seqlen, -1))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


def freqs(seq: int, theta: float = 500000.0) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, DIM // HEADS, 2).float() / (DIM // HEADS)))
    return torch.polar(torch.ones(seq, inv.numel()), torch.outer(torch.arange(seq).float(), inv))


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0]
               if isinstance(t, torch.Tensor))


class EagerBytes(TorchDispatchMode):
    """Bytes each dispatched memory-bound op reads and writes, by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[1]
        if name not in NOT_MEMORY_BOUND | MOVE_NOTHING:
            self.by_op[name] += _nbytes((args, kwargs)) + _nbytes(out)
        return out


def _inputs():
    torch.manual_seed(0)
    block = TransformerBlock().to(torch.bfloat16)
    x = torch.randn(1, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    return block, x, freqs(SEQ)


def eager_bytes() -> tuple[int, int]:
    """(forward, backward) bytes of the eager block's memory-bound ops."""
    block, x, f = _inputs()
    with EagerBytes() as fwd:
        y = block(x, f)
    with EagerBytes() as bwd:
        y.backward(torch.ones_like(y))
    return sum(fwd.by_op.values()), sum(bwd.by_op.values())


def _left_to_aten(node) -> str | None:
    """The aten op name of an extern kernel Inductor calls instead of generating code (a
    matmul, attention, or an op it cannot generate such as a complex multiply); None for the
    kernels it generates."""
    from torch._inductor.scheduler import ExternKernelSchedulerNode

    if not isinstance(node, ExternKernelSchedulerNode):
        return None
    op = getattr(node.node, "op_overload", None)
    return op._schema.name.split("::")[1] if op is not None else ""


def _moves_bytes(node) -> bool:
    """A kernel of the compiled graph that is memory-bound work: generated by Inductor, or an
    extern one other than matmuls, attention and views."""
    name = _left_to_aten(node)
    return name is None or name not in NOT_MEMORY_BOUND | MOVE_NOTHING


def compiled_bytes() -> list[int]:
    """Bytes of Inductor's generated kernels, per compiled graph (forward, then backward)."""
    return compiled_graph_sums(lambda node: node.get_read_write_buffers_sizes()
                               if _moves_bytes(node) else 0)


def compiled_graph_sums(measure) -> list[int]:
    """``measure`` summed over the scheduler nodes (the kernels) of each graph Inductor
    compiles for the block's forward and backward, in order; the compile caches are off so
    that every graph is generated here."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor import graph as inductor_graph

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    counted: list[int] = []
    original = inductor_graph.GraphLowering.codegen

    def codegen(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        counted.append(sum(measure(node) for node in self.scheduler.nodes))
        return result

    inductor_graph.GraphLowering.codegen = codegen
    torch._dynamo.reset()
    try:
        block, x, f = _inputs()
        compiled = torch.compile(block, fullgraph=True)
        compiled(x, f).backward(torch.ones(1, SEQ, DIM, dtype=torch.bfloat16))
    finally:
        inductor_graph.GraphLowering.codegen = original
    return counted


def main() -> None:
    unit = 2 * DIM * SEQ  # one bf16 hidden vector per token
    fwd, bwd = eager_bytes()
    graphs = compiled_bytes()
    print(f"block {DIM} hidden, {FFN} ffn, {HEADS}/{KV_HEADS} heads, {SEQ} tokens, bf16; "
          f"bytes in units of one bf16 hidden vector per token")
    print(f"eager:    forward {fwd / unit:6.1f}  backward {bwd / unit:6.1f}  "
          f"(backward / forward {bwd / fwd:.2f})")
    print("compiled: " + "  ".join(f"graph {i} {b / unit:6.1f}" for i, b in enumerate(graphs)))
    print(f"compiled / eager, forward and backward: {sum(graphs) / (fwd + bwd):.3f}")


if __name__ == "__main__":
    main()
