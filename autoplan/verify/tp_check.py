"""Can a model's blocks run on tensor-parallel shards as written?

Megatron-style TP hands each rank the local slice of a column-parallel Linear's output; code
that reshapes it with a hard-coded head count (``view(b, s, self.num_heads, d)``) or splits a
fused QKV output by the full hidden size then fails or, worse, computes the wrong thing. The
check runs block 0 on the meta device with its Linears replaced by their local shapes and
reports the first line of the model's code that fails. Such models still train correctly under
the verifier and the torchrun export, which keep column outputs as DTensors with global shapes,
at the price of the extra communication DTensor inserts for the reshape.
"""

from __future__ import annotations

import contextlib
import io
import os
import traceback

import torch
from torch import nn

from autoplan.graph.layer_graph import LayerGraph, TpSplit
from autoplan.graph.loader import ModelSource, build_on_meta
from autoplan.verify.chain import Chain

_TORCH_DIR = os.path.dirname(torch.__file__)


def _local_linear(linear: nn.Linear, split: TpSplit, tp: int) -> nn.Linear:
    in_f, out_f = linear.in_features, linear.out_features
    if split is TpSplit.COLUMN:
        out_f //= tp
    else:
        in_f //= tp
    return nn.Linear(in_f, out_f, bias=linear.bias is not None, device="meta")


def _user_frame(err: BaseException) -> traceback.FrameSummary | None:
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith(_TORCH_DIR) and "/autoplan/verify/" not in f.filename]
    return frames[-1] if frames else None


def local_tp_problem(source: ModelSource, graph: LayerGraph, tp: int) -> str | None:
    """None when block 0 runs on local TP shards; else a sentence naming the failing line."""
    chain = Chain.of(graph)
    model = build_on_meta(source).float()
    named = dict(model.named_modules())
    for gemm in graph.layers[chain.blocks[0]].gemms:
        if gemm.split not in (TpSplit.COLUMN, TpSplit.ROW) or gemm.name not in named:
            continue
        parent, _, child = gemm.name.rpartition(".")
        setattr(named[parent] if parent else model, child,
                _local_linear(named[gemm.name], gemm.split, tp))
    tokens = torch.zeros(1, graph.seq_len, dtype=torch.long, device="meta")
    try:
        with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
            model(tokens)
    except Exception as err:  # user code: any failure is the finding
        frame = _user_frame(err)
        where = f"{frame.filename}:{frame.lineno}: `{(frame.line or '').strip()}`" if frame else "?"
        return (f"{graph.name} cannot be tensor-parallelized as written: {where} fails on the "
                f"local shards of tp={tp} ({type(err).__name__}: {str(err).splitlines()[0]}). "
                "The run keeps column-parallel outputs as DTensors with global shapes, so TP is "
                "verified, but DTensor may insert an all-gather there; derive head counts from "
                "the tensor (view(b, s, -1, head_dim)) and keep Q, K and V in separate Linears "
                "for Megatron-style local shards.")
    return None
