"""torchtitan 0.3: command-line overrides of its config dataclasses and a torchrun script.

Names follow ``torchtitan.config.configs`` (``TrainingConfig``, ``ParallelismConfig``) and the
``activation_checkpoint`` subcommands of ``torchtitan.distributed.activation_checkpoint``;
torchtitan parses them with tyro, which takes no top-level flag after a subcommand, so the
activation-checkpointing choice comes last.

Batch sizes mean something else than in Megatron: ``training.local_batch_size`` is what one
data-parallel rank processes per optimizer step *per forward call*: the pipeline splits it into
micro-batches of ``pipeline_parallel_microbatch_size``; without a pipeline, gradient accumulation
comes from ``training.global_batch_size`` exceeding ``local_batch_size * dp``.
"""

from __future__ import annotations

from autoplan.errors import ExportError
from autoplan.plan import Offload, PipelineSchedule, Result
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.launch import args_file_text, torchrun_script
from autoplan.plugins.stages import require_ends, stage_kinds
from autoplan.plugins.summary import comment_header, seq_len

ARGS_FILE = "torchtitan_args.txt"
SCRIPT_FILE = "launch_torchtitan.sh"

# torchtitan's module names in its decoder-only models (tok_embeddings, layers.N, norm, lm_head).
_MODULE_OF_KIND = {"embedding": "tok_embeddings", "norm": "norm", "head": "lm_head"}


def check(result: Result) -> None:
    """Refuse plans torchtitan cannot run as planned.

    Raises:
        ExportError: saying which rule fails and what to change.
    """
    problems = capability_problems(result, "torchtitan")
    plan = result.plan
    if plan.vpp > 1 and plan.pp == 1:
        problems.append(f"vpp={plan.vpp} needs pp > 1")
    if problems:
        raise ExportError("torchtitan cannot run this plan: " + "; ".join(problems) + ".")


def _data_parallel_args(result: Result) -> list[str]:
    """ZeRO 0 is DDP (replicate); ZeRO 1-2 is FSDP2 keeping parameters after forward (its
    closest match: it shards optimizer state and gradients); ZeRO-3 reshards after forward."""
    plan = result.plan
    replicate, shard = (plan.dp, 1) if plan.zero_stage == 0 else (1, plan.dp)
    reshard = "always" if plan.zero_stage == 3 else "never"
    return ["--parallelism.data_parallel_replicate_degree", str(replicate),
            "--parallelism.data_parallel_shard_degree", str(shard),
            "--parallelism.fsdp_reshard_after_forward", reshard]


def module_fqns_per_stage(result: Result) -> list[list[str]]:
    """The modules of each pipeline stage, named as torchtitan's models name them."""
    require_ends(result, "torchtitan")
    parts, block = [], 0
    for kinds in stage_kinds(result):
        names = []
        for kind in kinds:
            if kind == "block":
                names.append(f"layers.{block}")
                block += 1
            elif kind in _MODULE_OF_KIND:
                names.append(_MODULE_OF_KIND[kind])
        parts.append(names)
    return parts


def _schedule_name(plan) -> str:
    """torchtitan's name of the plan's pipeline schedule (torch.distributed.pipelining)."""
    if plan.pipeline_schedule is PipelineSchedule.ZERO_BUBBLE:
        return "InterleavedZeroBubble"
    return "Interleaved1F1B" if plan.vpp > 1 else "1F1B"


def _pipeline_args(result: Result) -> list[str]:
    plan = result.plan
    if plan.pp == 1:
        return ["--parallelism.pipeline_parallel_degree", "1"]
    parts = [",".join(names) for names in module_fqns_per_stage(result)]
    return ["--parallelism.pipeline_parallel_degree", str(plan.pp),
            "--parallelism.pipeline_parallel_schedule",
            _schedule_name(plan),
            "--parallelism.pipeline_parallel_microbatch_size", str(plan.micro_batch_size),
            "--parallelism.module_fqns_per_model_part", *parts]


def _training_args(result: Result) -> list[str]:
    plan = result.plan
    local = plan.micro_batch_size * (plan.num_microbatches if plan.pp > 1 else 1)
    args = ["--training.local_batch_size", str(local),
            "--training.global_batch_size", str(plan.global_batch_size),
            "--training.seq_len", str(seq_len(result)),
            "--training.mixed_precision_param", "bfloat16"]
    # FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer state together.
    if plan.offload != Offload.NONE:
        args.append("--training.enable_cpu_offload")
    return args


def _compile_args(result: Result) -> list[str]:
    """torch.compile of the blocks where the plan was priced with it (CompileConfig: the
    model only, the loss eager as the fsdp runtime's ``compile`` prices it)."""
    if result.training is None or not result.training.torch_compile:
        return []
    return ["--compile.enable", "--compile.components", "model"]


def torchtitan_overrides(result: Result) -> list[str]:
    """The command-line overrides that set up this plan, to follow ``--module M --config C``.

    Raises:
        ExportError: torchtitan cannot run the plan (see :func:`check`).
    """
    check(result)
    plan = result.plan
    sp = "--parallelism.enable_sequence_parallel" if plan.sequence_parallel else \
        "--parallelism.no_enable_sequence_parallel"
    return (_data_parallel_args(result)
            + ["--parallelism.tensor_parallel_degree", str(plan.tp), sp,
               "--parallelism.context_parallel_degree", str(plan.cp)]
            + (["--parallelism.expert_parallel_degree", str(plan.ep)] if plan.ep > 1 else [])
            + _pipeline_args(result) + _training_args(result) + _compile_args(result)
            + [f"activation_checkpoint:{plan.recompute.value}"])


def render(result: Result) -> dict[str, str]:
    """``torchtitan_args.txt`` and ``launch_torchtitan.sh``."""
    notes = ("Set TORCHTITAN_MODULE and TORCHTITAN_CONFIG to the model and config registry "
             "entry (e.g. llama3 llama3_8b); extra arguments go before the plan's, which win.",
             "Offload, if planned, is FSDP2's CPUOffloadPolicy (parameters, gradients and "
             "optimizer state).")
    args = torchtitan_overrides(result)
    header = comment_header(result, title="torchtitan command-line overrides.", notes=notes)
    script = torchrun_script(
        result, header=comment_header(result, title="torchtitan launch script (torchrun, one "
                                      "call per node).", notes=notes),
        required={"TORCHTITAN_MODULE": "set TORCHTITAN_MODULE to a torchtitan model, e.g. llama3",
                  "TORCHTITAN_CONFIG": "set TORCHTITAN_CONFIG to its config, e.g. llama3_8b"},
        env={}, args_file=ARGS_FILE, user_args_first=True,
        program='-m torchtitan.train --module "$TORCHTITAN_MODULE" --config "$TORCHTITAN_CONFIG"')
    return {ARGS_FILE: args_file_text(header, args), SCRIPT_FILE: script}


exporter = Exporter(name="torchtitan", description="torchtitan command-line overrides and "
                    "torchrun launch script", render=render)
