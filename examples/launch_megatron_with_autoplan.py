#!/usr/bin/env python3
"""Plan at start-up, then launch Megatron-LM with the plan.

    python examples/launch_megatron_with_autoplan.py MODEL.py CLUSTER.yaml \\
        --seq-len 2048 --global-batch 512 --tp auto --pp 1 --micro-batch-size auto \\
        [--megatron-lm PATH] [--node-rank R] [--dry-run] -- <more pretrain_gpt.py arguments>

Each of ``--tp``, ``--pp`` and ``--micro-batch-size`` is ``auto`` (the default: autoplan
searches it) or a number (pinned). The script calls ``autoplan.solve`` on the model and
cluster, then runs, on this node,

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr A --master-port P \\
        $MEGATRON_LM/pretrain_gpt.py <megatron_args(plan)> <your arguments>

replacing itself with it (``--dry-run`` prints the command instead). Your arguments come last,
so data, tokenizer, optimizer and checkpoint settings are yours; do not repeat the planned
parallelism, batch or model-shape flags there. Run it on every node with the same arguments and
its own ``--node-rank``: the solver is deterministic, so every node launches the same plan.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import autoplan
from autoplan.errors import AutoplanError
from autoplan.plugins import megatron_args
from autoplan.plugins.launch import DEFAULT_MASTER_PORT, nodes_of
from autoplan.plugins.megatron import needs_single_connection

PINNABLE = {"tp": "--tp", "pp": "--pp", "mbs": "--micro-batch-size"}


def auto_or_int(text: str) -> int | None:
    """``auto`` (None: searched) or a positive whole number (pinned)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's own arguments, and the user's (after ``--``) for pretrain_gpt.py."""
    ours, user = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="model.py defining build_model()")
    parser.add_argument("cluster", help="cluster.yaml describing the GPUs and links")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True,
                        help="sequences per optimizer step")
    for name, flag in PINNABLE.items():
        parser.add_argument(flag, dest=name, type=auto_or_int, default=None,
                            help="'auto' (default) to search, or a number to pin")
    parser.add_argument("--mem-limit", help="per-GPU memory cap, e.g. 72GiB")
    parser.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM", "."),
                        help="Megatron-LM checkout holding pretrain_gpt.py (default: $MEGATRON_LM)")
    parser.add_argument("--node-rank", type=int,
                        default=int(os.environ.get("NODE_RANK", os.environ.get("RANK", "0"))))
    parser.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR"),
                        help="address of node rank 0 (default: the first host in cluster.yaml)")
    parser.add_argument("--master-port", type=int,
                        default=int(os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)))
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    return parser.parse_args(ours), user


def plan(args: argparse.Namespace) -> autoplan.Result:
    pins = {name: getattr(args, name) for name in PINNABLE if getattr(args, name) is not None}
    return autoplan.solve(args.model, args.cluster, seq_len=args.seq_len,
                          global_batch=args.global_batch, pins=pins, mem_limit=args.mem_limit)


def command(result: autoplan.Result, args: argparse.Namespace, user: list[str]) -> list[str]:
    """The torchrun command line of this node."""
    nodes = nodes_of(result)
    master = args.master_addr or nodes.master_ip
    if master is None:
        raise SystemExit("error: cluster.yaml lists no hosts; give --master-addr (node rank 0).")
    return ["torchrun", "--nnodes", str(nodes.num_nodes),
            "--nproc-per-node", str(nodes.gpus_per_node), "--node-rank", str(args.node_rank),
            "--master-addr", master, "--master-port", str(args.master_port),
            os.path.join(args.megatron_lm, "pretrain_gpt.py"), *megatron_args(result), *user]


def main(argv: list[str] | None = None) -> None:
    args, user = parse(sys.argv[1:] if argv is None else argv)
    try:
        result = plan(args)
        cmd = command(result, args, user)
    except AutoplanError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    p, est = result.plan, result.estimate
    print(f"autoplan: TP{p.tp} PP{p.pp} DP{p.dp} mbs {p.micro_batch_size}, "
          f"{est.step_time_s:.3f} s per step, {est.peak_memory_gib:.1f} GiB per GPU",
          file=sys.stderr)
    env = dict(os.environ)
    if needs_single_connection(result):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if args.dry_run:
        prefix = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if needs_single_connection(result) else ""
        print(prefix + shlex.join(cmd))
        return
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
