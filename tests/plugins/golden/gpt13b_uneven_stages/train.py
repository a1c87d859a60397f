# PyTorch native stack (DeviceMesh, parallelize_module, pipelining, FSDP2) launched with torchrun.
#
# Planned by autoplan for gpt-13b on one DGX A100.
# Plan: TP2 x PP4 x DP1, mbs 2, ZeRO-0, full recompute, SP on 8 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 2 x 16 micro-batches x DP 1 = global batch 32 sequences of 2048 tokens, fp16.
# Predicted for Megatron-LM: 7.500 s/step, 8,738 tokens/s, MFU 45.0%, peak memory 70.2 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# Run launch_torchrun.sh on every node with MODEL_PY set to your model.py; autoplan must be installed there.
# train.py trains on random tokens: replace batches() with your data.
"""Train model.py with the plan in plan.json (written by autoplan export --to torchrun)."""

import argparse
import json
import os

import torch
import torch.distributed as dist

from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
from autoplan.plan import Plan
from autoplan.verify.parallel import build_rank


def batches(vocab, plan, seq_len, dp_rank, steps):
    """Random tokens; replace with your data loader (one [global_batch / dp, seq] per step)."""
    gen = torch.Generator().manual_seed(0)
    per_dp = plan.global_batch_size // plan.dp
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (plan.global_batch_size, seq_len), generator=gen)
        yield tokens[dp_rank * per_dp:(dp_rank + 1) * per_dp]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="model.py")
    parser.add_argument("--plan", required=True, help="plan.json")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.set_default_device(device)
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    plan = Plan.model_validate(json.load(open(args.plan)))
    source = load_model_source(args.model)
    graph = trace_model(source, seq_len=args.seq_len, precision="fp32")
    rank_model = build_rank(source, graph, plan, seed=0, seq_len=args.seq_len)
    vocab = graph.dims.vocab_size if graph.dims else 2
    for step, tokens in enumerate(batches(vocab, plan, args.seq_len, rank_model.dp_rank,
                                          args.steps)):
        loss = rank_model.train_step(tokens)
        if loss is not None and rank_model.mesh.get_local_rank("tp") == 0:
            print(f"step {step} dp_rank {rank_model.dp_rank} loss {loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
