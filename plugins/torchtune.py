"""torchtune 0.6.1: the recipe that runs a plan and its ``tune run`` key=value overrides.

The keys are what the recipes read (``recipes/*.py``: ``cfg.batch_size``,
``cfg.gradient_accumulation_steps``, ``cfg.get("enable_activation_checkpointing")``, ...) and
their shipped configs hold (``recipes/configs/**.yaml``); ``tests/plugins/test_torchtune.py``
checks every key against both, and the LoRA and optimizer keys against the builders' and
optimizers' own arguments.

Which recipe: ``lora_finetune_*`` for a PEFT LoRA model (``model.lora`` in the plan JSON),
``full_finetune_*`` when every parameter trains; ``*_single_device`` on one GPU, else
``*_distributed`` (FSDP2 on every rank, and on one GPU too when the plan offloads to CPU:
only the distributed recipes read ``fsdp_cpu_offload``).

torchtune trains in bf16 throughout (its recipes' docstring: "all activations, gradients and
optimizer states are in bfloat16", no fp32 master weights), so a plan priced with
mixed-precision state runs in less memory than priced.
"""

from __future__ import annotations

import shlex

from autoplan.capabilities import accumulation_gap
from autoplan.errors import ExportError
from autoplan.plan import LoraInfo, Offload, Recompute, Result
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.launch import nccl_environment, nodes_of, read_args_lines, rendezvous_lines
from autoplan.plugins.summary import comment_header

ARGS_FILE = "torchtune_overrides.txt"
SCRIPT_FILE = "launch_torchtune.sh"

ATTENTION_TARGETS = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj",
                     "o_proj": "output_proj", "output_proj": "output_proj"}
"""Adapted attention Linears (Hugging Face's name, or torchtune's) -> torchtune's
``lora_attn_modules`` entry (``LORA_ATTN_MODULES``, torchtune/modules/peft/_utils.py)."""
MLP_TARGETS = ({"gate_proj", "up_proj", "down_proj"}, {"w1", "w2", "w3"})
"""The three MLP Linears (Hugging Face's names, torchtune's): ``apply_lora_to_mlp`` adapts
all three or none."""
OUTPUT_TARGETS = {"lm_head", "output"}  # apply_lora_to_output

EXAMPLE_CONFIGS = {"lora_finetune_single_device": "llama2/7B_lora_single_device",
                   "lora_finetune_distributed": "llama2/7B_lora",
                   "full_finetune_single_device": "llama2/7B_full_low_memory",
                   "full_finetune_distributed": "llama2/7B_full"}
"""A shipped config of each recipe (``tune ls``), named in the files as an example."""

OPTIMIZERS = {"adamw": ("torch.optim.AdamW", ()),
              "adamw8bit": ("torchao.optim.AdamW8bit", ("~optimizer.fused",)),
              "sgd": ("torch.optim.SGD", ("optimizer.momentum=0.9",))}
"""The optimizer component of each ``--optimizer`` and what else it needs: torchao's AdamW8bit
(uint8 states, one fp32 scale per 256 values, as priced; it runs under FSDP2, and torchao comes
with torchtune) takes no ``fused``, which the shipped configs give torch's AdamW; SGD is priced
with a momentum buffer."""


def is_lora(result: Result) -> bool:
    return result.model is not None and result.model.lora is not None


def _frozen(result: Result) -> int:
    model = result.model
    if model is None or model.num_trainable_params is None:
        return 0
    return model.num_params - model.num_trainable_params


def distributed(result: Result) -> bool:
    """Whether a distributed recipe runs the plan: more than one GPU, or CPU offload."""
    return result.plan.world_size > 1 or result.plan.offload is not Offload.NONE


def recipe(result: Result) -> str:
    """The torchtune recipe (``tune ls``) that runs the plan."""
    kind = "lora" if is_lora(result) else "full"
    return f"{kind}_finetune_{'distributed' if distributed(result) else 'single_device'}"


def _lora_problems(lora: LoraInfo) -> list[str]:
    targets = set(lora.targets)
    known = set(ATTENTION_TARGETS) | OUTPUT_TARGETS | set().union(*MLP_TARGETS)
    problems = [f"adapters on {', '.join(sorted(targets - known))} have no torchtune LoRA "
                "builder argument (lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output)"
                ] if targets - known else []
    if any(targets & mlp and not mlp <= targets for mlp in MLP_TARGETS):
        problems.append("its LoRA builders adapt all three MLP Linears or none "
                        "(apply_lora_to_mlp), not " + ", ".join(sorted(
                            targets & set().union(*MLP_TARGETS))))
    return problems


def _fine_tuning_problems(result: Result) -> list[str]:
    """What the recipe chosen for the model cannot train as planned."""
    training, plan, problems = result.training, result.plan, []
    frozen_dtype = training.frozen_dtype if training is not None else None
    if _frozen(result) and not is_lora(result):
        problems.append(f"its recipes train every parameter (full_finetune_*) or LoRA adapters "
                        f"(lora_finetune_*), but this model freezes {_frozen(result):,} "
                        "parameters without PEFT LoRA adapters (a plan JSON written before "
                        "model.lora was recorded: solve again)")
    if is_lora(result):
        problems += _lora_problems(result.model.lora)
        if plan.tp > 1:
            problems.append("its LoRA recipes have no tensor parallelism (tensor_parallel_dim "
                            "is full_finetune_distributed's); re-plan with --tp 1")
    if _frozen(result) and frozen_dtype not in (None, "bf16", "nf4"):
        problems.append(f"it stores a frozen base in bf16 or NF4 (QLoRA's quantize_base) only, "
                        f"not {frozen_dtype}")
    if training is not None and training.optimizer_in_backward:
        if is_lora(result):
            problems.append("its LoRA recipes have no optimizer_in_bwd (full_finetune_* only)")
        if (gap := accumulation_gap(plan)) is not None:
            problems.append(gap)
    return problems


def check(result: Result) -> None:
    """Refuse plans torchtune cannot run as planned.

    Raises:
        ExportError: saying which rule fails and what to change.
    """
    problems = capability_problems(result, "torchtune") + _fine_tuning_problems(result)
    if problems:
        raise ExportError("torchtune cannot run this plan: " + "; ".join(problems) + ".")


def _flag(value: bool) -> str:
    return "True" if value else "False"


def _optimizer_overrides(result: Result) -> list[str]:
    training = result.training
    component, extra = OPTIMIZERS[training.optimizer if training is not None else "adamw"]
    overrides = [f"optimizer._component_={component}", *extra]
    if not is_lora(result):
        in_backward = training is not None and training.optimizer_in_backward
        overrides.append(f"optimizer_in_bwd={_flag(in_backward)}")
        if in_backward:
            overrides.append("clip_grad_norm=None")  # the recipe raises on clipping in bwd
    return overrides


def _parallel_overrides(result: Result) -> list[str]:
    """FSDP2 resharding after forward for ZeRO-3 (not for ZeRO-2), CPUOffloadPolicy for the
    offload, TP in the full fine-tune's recipe."""
    plan = result.plan
    if not distributed(result):
        return []
    overrides = [f"fsdp_reshard_after_forward={_flag(plan.zero_stage == 3)}",
                 f"fsdp_cpu_offload={_flag(plan.offload is Offload.PARAMS)}"]
    if not is_lora(result):
        overrides.append(f"tensor_parallel_dim={plan.tp}")
    return overrides


def _lora_overrides(result: Result) -> list[str]:
    lora, training = result.model.lora, result.training
    targets = set(lora.targets)
    attention = sorted({ATTENTION_TARGETS[t] for t in targets if t in ATTENTION_TARGETS},
                       key=list(ATTENTION_TARGETS.values()).index)
    quantized = _frozen(result) > 0 and training is not None and training.frozen_dtype == "nf4"
    return [f"model.lora_attn_modules=[{','.join(attention)}]",
            f"model.apply_lora_to_mlp={_flag(any(targets & mlp for mlp in MLP_TARGETS))}",
            f"model.apply_lora_to_output={_flag(bool(targets & OUTPUT_TARGETS))}",
            f"model.lora_rank={lora.rank}", f"model.lora_alpha={lora.alpha:g}",
            f"model.lora_dropout={lora.dropout:g}", f"model.quantize_base={_flag(quantized)}"]


def torchtune_overrides(result: Result) -> list[str]:
    """The ``key=value`` (and ``~key``) overrides that set up this plan, to follow
    ``tune run RECIPE --config CONFIG``.

    Raises:
        ExportError: torchtune cannot run the plan (see :func:`check`).
    """
    check(result)
    plan = result.plan
    overrides = [f"batch_size={plan.micro_batch_size}",
                 f"gradient_accumulation_steps={plan.num_microbatches}", "dtype=bf16",
                 f"enable_activation_checkpointing={_flag(plan.recompute is Recompute.FULL)}",
                 "enable_activation_offloading=False", "compile=False"]
    overrides += _optimizer_overrides(result) + _parallel_overrides(result)
    return overrides + (_lora_overrides(result) if is_lora(result) else [])


def command_line(result: Result) -> str:
    """The ``tune run`` command of the plan on one node (torchrun's rendezvous flags go
    before the recipe on more nodes)."""
    nodes = nodes_of(result)
    launch = ["tune", "run"]
    if distributed(result):
        launch += ["--nnodes", str(nodes.num_nodes), "--nproc_per_node", str(nodes.gpus_per_node)]
    return shlex.join([*launch, recipe(result), "--config", "CONFIG",
                       *torchtune_overrides(result)])


def _notes(result: Result) -> tuple[str, ...]:
    notes = [f"Recipe: {recipe(result)}. Command: {command_line(result)}",
             f"CONFIG: a config of that recipe for your model (tune ls), e.g. "
             f"{EXAMPLE_CONFIGS[recipe(result)]}; "
             "these overrides win over it. autoplan priced torch.compile off (compile=False) "
             "and activations kept on the GPU (enable_activation_offloading=False).",
             "torchtune trains in bf16 throughout (no fp32 master weights, optimizer state in "
             "bf16): it needs less memory than the mixed-precision state priced here."]
    if result.training is not None and result.training.optimizer == "adamw8bit":
        notes.append("~optimizer.fused removes torch AdamW's fused flag, which torchao's "
                     "AdamW8bit does not take; drop it if your config's optimizer has none.")
    if result.plan.tp > 1:
        notes.append("tensor_parallel_dim needs a tensor_parallel_plan in the config (e.g. "
                     "torchtune.models.llama3.base_llama_tp_plan).")
    return tuple(notes)


def launch_script(result: Result, header: str) -> str:
    """A bash script that runs ``tune run`` with the overrides file on this node."""
    lines = ["#!/usr/bin/env bash", header.rstrip("\n"), "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             f': "${{TORCHTUNE_CONFIG:?set TORCHTUNE_CONFIG to a config of {recipe(result)} '
             f'for your model (tune ls), e.g. {EXAMPLE_CONFIGS[recipe(result)]}}}"']
    launch = "exec tune run"
    if distributed(result):
        nodes = nodes_of(result)
        lines += [f"export {name}={shlex.quote(value)}"
                  for name, value in nccl_environment(nodes).items()]
        lines += rendezvous_lines(nodes)
        # tune run goes standalone (localhost rendezvous) unless given an endpoint.
        launch += (' --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" --node_rank '
                   '"$NODE_RANK" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"')
    lines += read_args_lines(ARGS_FILE)
    lines.append(f'{launch} {recipe(result)} --config "$TORCHTUNE_CONFIG" "${{ARGS[@]}}" "$@"')
    return "\n".join(lines) + "\n"


def render(result: Result) -> dict[str, str]:
    """``torchtune_overrides.txt`` (one override per line) and ``launch_torchtune.sh``."""
    overrides = torchtune_overrides(result)
    notes = _notes(result)
    header = comment_header(result, title="torchtune recipe overrides (tune run key=value).",
                            notes=notes)
    script = launch_script(result, comment_header(
        result, title="torchtune launch script (tune run, one call per node).", notes=notes))
    return {ARGS_FILE: header + "\n".join(overrides) + "\n", SCRIPT_FILE: script}


exporter = Exporter(name="torchtune", description="torchtune recipe and tune run key=value "
                    "overrides", render=render)
