"""PyTorch's native stack launched with torchrun: ``train.py`` and ``launch_torchrun.sh``.

``train.py`` builds the plan with :mod:`autoplan.verify.parallel`, the same code that
``autoplan verify`` runs and checks against a single-process reference: a DeviceMesh in the
plan's placement order, ``parallelize_module`` (ColwiseParallel/RowwiseParallel from the traced
TP plan, SequenceParallel norms), ``torch.distributed.pipelining`` stages cut where the plan cuts
(1F1B or interleaved 1F1B), FSDP2 ``fully_shard`` for ZeRO 1-3 and activation checkpointing.
The training node needs autoplan installed and the user's model.py; data loading is the user's
(the script trains on random tokens until they replace ``batches``).
"""

from __future__ import annotations

import json
import shlex

from autoplan.errors import ExportError
from autoplan.plan import Result
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.launch import args_file_text, nodes_of, torchrun_script
from autoplan.plugins.stages import stage_kinds
from autoplan.plugins.summary import comment_header, seq_len

SCRIPT_FILE = "launch_torchrun.sh"
ARGS_FILE = "torchrun_args.txt"
TRAIN_FILE = "train.py"
PLAN_FILE = "plan.json"

TRAIN_PY = '''\
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
'''


def check(result: Result) -> None:
    """Refuse plans the native-stack script does not build.

    Raises:
        ExportError: naming the rule and what to change.
    """
    problems = capability_problems(result, "torchrun")
    plan = result.plan
    if plan.vpp > 1 and plan.pp == 1:
        problems.append(f"vpp={plan.vpp} needs pipeline parallelism (pp > 1)")
    if problems:
        raise ExportError("torchrun cannot run this plan: " + "; ".join(problems) +
                          ". Re-plan with pins that avoid it, or export to another target.")
    stage_kinds(result)  # the stages cover the chain in order


def render(result: Result) -> dict[str, str]:
    """``train.py``, ``plan.json``, ``torchrun_args.txt`` and ``launch_torchrun.sh``."""
    check(result)
    nodes_of(result)
    notes = ("Run launch_torchrun.sh on every node with MODEL_PY set to your model.py; "
             "autoplan must be installed there.",
             "train.py trains on random tokens: replace batches() with your data.")
    header = comment_header(result, title="PyTorch native stack (DeviceMesh, "
                            "parallelize_module, pipelining, FSDP2) launched with torchrun.",
                            notes=notes)

    script = torchrun_script(
        result, header=header,
        required={"MODEL_PY": "set MODEL_PY to the model.py the plan was made for"},
        env={}, args_file=ARGS_FILE,
        program=f'"$HERE"/{shlex.quote(TRAIN_FILE)} --model "$MODEL_PY" --plan "$HERE"/{PLAN_FILE}')
    return {
        TRAIN_FILE: header + TRAIN_PY,
        PLAN_FILE: json.dumps(result.plan.model_dump(mode="json"), indent=2) + "\n",
        ARGS_FILE: args_file_text(header, ["--seq-len", str(seq_len(result))]),
        SCRIPT_FILE: script,
    }


exporter = Exporter(name="torchrun", description="PyTorch native stack (DeviceMesh, "
                    "parallelize_module, pipelining, FSDP2) train.py and torchrun launch script",
                    render=render)
