"""DeepSpeed: ``ds_config.json``, ``hostfile``, ``.deepspeed_env`` and a ``deepspeed`` launch line.

What users get burnt by, and what this module does about it:

- ``"auto"`` values are only filled in by the Hugging Face integration; every number here is
  concrete, and ``train_batch_size = train_micro_batch_size_per_gpu *
  gradient_accumulation_steps * dp`` holds (DeepSpeedConfig asserts it at start-up).
- The pipeline engine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism";
  such plans are refused here, before a cluster is allocated.
- The hostfile lists IP addresses: names resolve differently on the launching node and the
  workers (DESIGN.md, operations lore).
- The launcher splits every ``.deepspeed_env`` line on ``=`` and crashes on blank or comment
  lines, so that file holds ``KEY=VALUE`` lines only; its explanation lives in the launch script.
- A pipeline is Megatron-DeepSpeed's (as MT-NLG and BLOOM ran): Megatron TP modules inside
  DeepSpeed's PipelineModule and pipeline engine, ZeRO-1 at most. Its ``pretrain_gpt.py``
  arguments (``megatron/arguments.py``: ``--tensor-model-parallel-size``,
  ``--pipeline-model-parallel-size``, ``--zero-stage``, ``--deepspeed-activation-checkpointing``
  ...) go to ``megatron_deepspeed_args.txt``, read by the launch script. Without a pipeline, TP
  is AutoTP (``tensor_parallel.autotp_size`` in ds_config), which runs with every ZeRO stage.
"""

from __future__ import annotations

import json
import shlex

from autoplan.errors import ExportError
from autoplan.plan import Offload, Recompute, Result
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.launch import (Nodes, args_file_text, nccl_environment, nodes_of,
                                     read_args_lines)
from autoplan.plugins.summary import comment_header, precision, require_model, seq_len

CONFIG_FILE = "ds_config.json"
HOSTFILE = "hostfile"
ENV_FILE = ".deepspeed_env"
SCRIPT_FILE = "launch_deepspeed.sh"
MDS_ARGS_FILE = "megatron_deepspeed_args.txt"


def check(result: Result) -> None:
    """Refuse plans DeepSpeed cannot run as planned.

    Raises:
        ExportError: saying which rule fails and what to change.
    """
    problems = capability_problems(result, "deepspeed")
    if problems:
        raise ExportError("DeepSpeed cannot run this plan: " + "; ".join(problems) + ".")


def _zero_block(result: Result) -> dict:
    plan = result.plan
    block: dict = {"stage": plan.zero_stage}
    if plan.offload in (Offload.OPTIMIZER, Offload.PARAMS):
        block["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload == Offload.PARAMS:
        block["offload_param"] = {"device": "cpu", "pin_memory": True}
    return block


def _precision_block(result: Result) -> dict:
    if precision(result) == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0}}  # 0 = dynamic loss scaling
    return {"bf16": {"enabled": True}}


def deepspeed_config(result: Result) -> dict:
    """The ``ds_config.json`` mapping for the plan, every value concrete.

    Raises:
        ExportError: DeepSpeed cannot run the plan (see :func:`check`).
    """
    check(result)
    plan = result.plan
    config: dict = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "zero_optimization": _zero_block(result),
        **_precision_block(result),
    }
    if plan.recompute != Recompute.NONE:
        config["activation_checkpointing"] = {
            "partition_activations": plan.tp > 1, "cpu_checkpointing": False,
            "contiguous_memory_optimization": False, "synchronize_checkpoint_boundary": False}
    if plan.pp > 1:
        config["pipeline"] = {
            "stages": plan.pp,
            "activation_checkpoint_interval": 1 if plan.recompute == Recompute.FULL else 0}
    if plan.tp > 1 and plan.pp == 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.zero_stage >= 1 and _client_optimizer(result):
        config["zero_allow_untested_optimizer"] = True
    return config


def _client_optimizer(result: Result) -> str | None:
    """The optimizer the training script passes that DeepSpeed's ZeRO does not list as tested
    (``ZERO_SUPPORTED_OPTIMIZERS``: Adam(W), Adagrad, Lion and its own): the engine then
    asserts unless ``zero_allow_untested_optimizer`` is set."""
    optimizer = result.training.optimizer if result.training is not None else "adamw"
    return {"adamw8bit": "bitsandbytes.optim.AdamW8bit", "sgd": "torch.optim.SGD"}.get(optimizer)


def megatron_deepspeed_args(result: Result) -> list[str]:
    """Megatron-DeepSpeed ``pretrain_gpt.py`` arguments of a pipelined plan: Megatron TP,
    DeepSpeed's pipeline engine, the ZeRO stage (matching ds_config), activation checkpointing
    through DeepSpeed, batch and model shape; data, tokenizer and optimizer are the user's.

    Raises:
        ExportError: DeepSpeed cannot run the plan, or the plan JSON lacks the model's shape.
    """
    check(result)
    plan, model = result.plan, require_model(result)
    missing = [name for name in ("hidden_size", "num_layers", "num_heads", "ffn_hidden_size")
               if getattr(model, name) is None]
    if missing:
        raise ExportError(f"the plan's model section lacks {', '.join(missing)}; "
                          "Megatron-DeepSpeed needs them. Re-run 'autoplan solve' on a model "
                          "whose shape is known.")
    length = str(seq_len(result))
    args = ["--tensor-model-parallel-size", str(plan.tp),
            "--pipeline-model-parallel-size", str(plan.pp),
            "--micro-batch-size", str(plan.micro_batch_size),
            "--global-batch-size", str(plan.global_batch_size),
            "--zero-stage", str(plan.zero_stage),
            "--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.ffn_hidden_size),
            "--num-attention-heads", str(model.num_heads),
            "--seq-length", length, "--max-position-embeddings", length,
            f"--{precision(result)}"]
    if plan.recompute is not Recompute.NONE:
        args += ["--checkpoint-activations", "--deepspeed-activation-checkpointing"]
    return args


def hostfile_text(nodes: Nodes) -> str:
    """``IP slots=N`` per node, in node-rank order; ``#`` comments are allowed by the parser.

    Raises:
        ExportError: several nodes but no host IPs in cluster.yaml.
    """
    if not nodes.hosts and nodes.num_nodes > 1:
        raise ExportError(
            f"a DeepSpeed hostfile needs the IP address of each of the {nodes.num_nodes} nodes; "
            "add hosts: [{name: node-01, ip: 10.0.0.1}, ...] to cluster.yaml and re-plan.")
    ips = [ip for _, ip in nodes.hosts] or [nodes.master_ip]
    return "".join(f"{ip} slots={nodes.gpus_per_node}\n" for ip in ips)


def _fine_tuned(result: Result) -> bool:
    model = result.model
    return bool(model and model.num_trainable_params is not None
                and model.num_trainable_params < model.num_params)


def _script(result: Result, nodes: Nodes, env: dict[str, str]) -> str:
    client = _client_optimizer(result)
    pipelined = result.plan.pp > 1
    engine = ("TRAIN_SCRIPT is Megatron-DeepSpeed's pretrain_gpt.py; it reads "
              f"{MDS_ARGS_FILE} (Megatron TP, DeepSpeed pipeline engine with "
              f"{result.plan.pp} stages)" if pipelined else
              "The model code builds the engine: deepspeed.initialize(..., "
              "config=ds_config.json)")
    notes = (
        engine + ".",
        *((f"Pass optimizer={client}(trainable parameters) to deepspeed.initialize.",)
          if client else ()),
        *(("Pass model_parameters=[p for p in model.parameters() if p.requires_grad]: only "
           "they get gradients and optimizer state.",) if _fine_tuned(result) else ()),
        f"{ENV_FILE} (read through DS_ENV_FILE) exports to every rank: "
        + (", ".join(f"{k}={v}" for k, v in env.items()) or "nothing needed here") + ".",
        "Run once, on the first host; extra arguments go to TRAIN_SCRIPT.",
    )
    master = nodes.master_ip or "${MASTER_ADDR:?set MASTER_ADDR}"
    args = read_args_lines(MDS_ARGS_FILE) if pipelined else []
    pass_args = '"${ARGS[@]}" ' if pipelined else ""
    return "\n".join([
        "#!/usr/bin/env bash",
        comment_header(result, title="DeepSpeed launch script.", notes=notes).rstrip("\n"),
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script (it calls deepspeed.initialize)}"',
        f'export DS_ENV_FILE="$HERE"/{shlex.quote(ENV_FILE)}',
        *args,
        f'exec deepspeed --hostfile "$HERE"/{shlex.quote(HOSTFILE)} --num_nodes {nodes.num_nodes} '
        f'--num_gpus {nodes.gpus_per_node} \\',
        f'  --master_addr "${{MASTER_ADDR:-{master}}}" --master_port "${{MASTER_PORT:-29500}}" \\',
        f'  "$TRAIN_SCRIPT" {pass_args}--deepspeed --deepspeed_config '
        f'"$HERE"/{shlex.quote(CONFIG_FILE)} "$@"',
    ]) + "\n"


def render(result: Result) -> dict[str, str]:
    """``ds_config.json``, ``hostfile``, ``.deepspeed_env`` and ``launch_deepspeed.sh``, and
    for a pipeline ``megatron_deepspeed_args.txt``."""
    config = deepspeed_config(result)
    nodes = nodes_of(result)
    env = nccl_environment(nodes)
    pipeline = {} if result.plan.pp == 1 else {MDS_ARGS_FILE: args_file_text(
        comment_header(result, title="Megatron-DeepSpeed pretrain_gpt.py arguments."),
        megatron_deepspeed_args(result))}
    return {
        **pipeline,
        CONFIG_FILE: json.dumps(config, indent=2) + "\n",
        HOSTFILE: comment_header(result, title="DeepSpeed hostfile: IP addresses in node-rank "
                                 "order.") + hostfile_text(nodes),
        ENV_FILE: "".join(f"{key}={value}\n" for key, value in env.items()),
        SCRIPT_FILE: _script(result, nodes, env),
    }


exporter = Exporter(name="deepspeed", description="DeepSpeed ds_config.json, hostfile, "
                    ".deepspeed_env and launch script", render=render)
