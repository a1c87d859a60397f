"""Megatron-LM: the ``pretrain_gpt.py`` arguments of a plan and a torchrun launch script.

Flag names follow current Megatron-LM (``megatron/training/arguments.py``) and megatron-core's
``TransformerConfig``: interleaving is ``--num-virtual-stages-per-pipeline-rank`` (the older
``--virtual-pipeline-model-parallel-size`` is gone), uneven stages use
``--decoder-first/last-pipeline-num-layers`` when the middle ranks are even and
``--pipeline-model-parallel-layout`` otherwise.

Rules Megatron only enforces once the job is running are checked here (see :func:`check`).
"""

from __future__ import annotations

from autoplan.errors import ExportError
from autoplan.plan import Offload, Recompute, Result
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.launch import args_file_text, torchrun_script
from autoplan.plugins.stages import blocks_per_stage, require_ends, stage_kinds
from autoplan.plugins.summary import comment_header, precision, require_model, seq_len
from autoplan.training import PIPELINE_INSIDE_PLACEMENT

ARGS_FILE = "megatron_args.txt"
SCRIPT_FILE = "launch_megatron.sh"


def check(result: Result) -> None:
    """Refuse plans Megatron-LM rejects only after the job has started.

    Raises:
        ExportError: saying which rule fails and what to change.
    """
    problems = capability_problems(result, "megatron")
    plan, model = result.plan, require_model(result)
    if plan.vpp > 1 and plan.pp == 1:
        problems.append(f"vpp={plan.vpp} needs pipeline parallelism (pp > 1)")
    if plan.vpp > 1 and (plan.num_microbatches < plan.pp or plan.num_microbatches % plan.pp):
        problems.append(
            f"the interleaved schedule needs the number of micro-batches ({plan.num_microbatches})"
            f" to be a multiple of pp={plan.pp} and at least pp")
    if plan.sequence_parallel and plan.tp == 1:
        problems.append("sequence parallelism needs tp > 1")
    if model.num_heads and model.num_heads % plan.tp:
        problems.append(f"{model.num_heads} attention heads do not divide by tp={plan.tp}")
    if plan.cp > 1 and seq_len(result) % (2 * plan.cp):
        problems.append(f"seq_len {seq_len(result)} must be a multiple of 2*cp = {2 * plan.cp}")
    if plan.ep > 1 and model.num_experts is None:
        problems.append(f"ep={plan.ep} needs the model's expert count (model.num_experts)")
    impl = result.training.transformer_impl if result.training is not None else None
    if precision(result) == "fp8" and impl not in (None, "transformer_engine"):
        problems.append(f"FP8 runs in Transformer Engine's layers, not --transformer-impl {impl}")
    if result.training is not None and result.training.tp_comm_overlap_cfg:
        problems.append("the plan was priced with a tp_comm_overlap_cfg, which the export does "
                        "not write (it passes --tp-comm-overlap with Transformer Engine's "
                        "defaults); price it without the cfg to export, or add "
                        "--tp-comm-overlap-cfg FILE to the arguments yourself")
    if problems:
        raise ExportError("Megatron-LM cannot run this plan: " + "; ".join(problems) +
                          ". Re-plan with pins that avoid it, or export to another target.")


def _parallel_args(result: Result) -> list[str]:
    plan = result.plan
    args = ["--tensor-model-parallel-size", str(plan.tp),
            "--pipeline-model-parallel-size", str(plan.pp),
            "--context-parallel-size", str(plan.cp)]
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.ep > 1:
        args += ["--expert-model-parallel-size", str(plan.ep)]
    if plan.placement == PIPELINE_INSIDE_PLACEMENT:  # rank order tp-cp-ep-pp-dp
        args.append("--use-tp-pp-dp-mapping")
    return args + _pipeline_split_args(result)


def megatron_partition(num_layers: int, pp: int, vpp: int, *, first: int | None = None,
                       last: int | None = None) -> list[int] | None:
    """Blocks per stage (pipeline order) that Megatron builds from these arguments, or None
    when TransformerConfig would reject them (mirrors its uneven-PP divisibility rules)."""
    per_rank = [first, *[None] * (pp - 2), last] if pp > 1 else [None]
    fixed = sum(n for n in (first, last) if n is not None)
    free = sum(1 for n in per_rank if n is None)
    if free and (num_layers - fixed) % free or (not free and fixed != num_layers):
        return None
    middle = (num_layers - fixed) // free if free else 0
    per_rank = [middle if n is None else n for n in per_rank]
    if any(n <= 0 or n % vpp for n in per_rank):
        return None
    return [per_rank[s % pp] // vpp for s in range(pp * vpp)]


def layout_string(result: Result) -> str:
    """``--pipeline-model-parallel-layout`` for the plan's stages: ``E`` embedding, ``t`` a
    transformer block, ``L`` the loss (with the output layer), ``|`` between stages in pipeline
    order, ``t*n`` for runs (megatron-core ``PipelineParallelLayerLayout.parse_str_to_list``)."""
    require_ends(result, "Megatron-LM")
    parts = []
    for kinds, blocks in zip(stage_kinds(result), blocks_per_stage(result)):
        text = "E" if "embedding" in kinds else ""
        text += "t" * blocks if blocks < 3 else f"t*{blocks}"
        parts.append(text + ("L" if "loss" in kinds else ""))
    return "|".join(parts)


def _pipeline_split_args(result: Result) -> list[str]:
    """The shortest arguments that make Megatron build exactly the plan's stages."""
    plan = result.plan
    if plan.pp == 1:
        return []
    counts = blocks_per_stage(result)
    vpp_args = ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)] if plan.vpp > 1 else []
    if megatron_partition(sum(counts), plan.pp, plan.vpp) == counts:
        return vpp_args
    per_rank = [sum(counts[rank::plan.pp]) for rank in range(plan.pp)]
    first, last = per_rank[0], per_rank[-1]
    if megatron_partition(sum(counts), plan.pp, plan.vpp, first=first, last=last) == counts:
        return vpp_args + ["--decoder-first-pipeline-num-layers", str(first),
                           "--decoder-last-pipeline-num-layers", str(last)]
    return ["--pipeline-model-parallel-layout", layout_string(result)]


def _batch_args(result: Result) -> list[str]:
    plan = result.plan
    return ["--micro-batch-size", str(plan.micro_batch_size),
            "--global-batch-size", str(plan.global_batch_size)]


def _recompute_args(result: Result) -> list[str]:
    recompute = result.plan.recompute
    if recompute == Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"]
    if recompute == Recompute.FULL and result.plan.recompute_num_layers is not None:
        # The first N blocks of each model chunk keep only their input, the rest everything.
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(result.plan.recompute_num_layers)]
    if recompute == Recompute.FULL:
        # Every block keeps only its input: uniform units of one layer.
        return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    return []


MEGATRON_FSDP_STRATEGIES = {2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP's ``--data-parallel-sharding-strategy`` for ZeRO-2 (optimizer state and
gradients sharded, parameters whole) and ZeRO-3 (parameters too)."""


def _optimizer_args(result: Result) -> list[str]:
    """ZeRO-1 is Megatron's distributed optimizer (it reduce-scatters gradients); ZeRO-2 and
    ZeRO-3 are Megatron-FSDP (v1, over the distributed optimizer) sharding gradients too, and
    parameters at ZeRO-3."""
    plan = result.plan
    args = []
    if plan.zero_stage >= 1 or plan.offload == Offload.OPTIMIZER:
        args.append("--use-distributed-optimizer")
    if plan.zero_stage < 3:
        # The cost model's megatron runtime prices gradient buckets reduced under the backward
        # and, with the distributed optimizer, parameters gathered under the next forward:
        # both are off in Megatron-LM unless asked for.
        args.append("--overlap-grad-reduce")
        if "--use-distributed-optimizer" in args:
            args.append("--overlap-param-gather")
    if plan.zero_stage in MEGATRON_FSDP_STRATEGIES:
        # Megatron-FSDP saves only fsdp_dtensor checkpoints and has no fused grad accumulation.
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                 MEGATRON_FSDP_STRATEGIES[plan.zero_stage], "--no-gradient-accumulation-fusion",
                 "--ckpt-format", "fsdp_dtensor"]
    if plan.offload == Offload.OPTIMIZER:
        # The hybrid CPU optimizer reuses the precision-aware optimizer's code path.
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
                 "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"]
    return args


def _model_args(result: Result) -> list[str]:
    model = require_model(result)
    missing = [name for name in ("hidden_size", "num_layers", "num_heads", "ffn_hidden_size")
               if getattr(model, name) is None]
    if missing:
        raise ExportError(f"the plan's model section lacks {', '.join(missing)}; Megatron-LM "
                          "needs them. Re-run 'autoplan solve' on a model whose shape is known.")
    length = str(seq_len(result))
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(model.num_heads),
            "--ffn-hidden-size", str(model.ffn_hidden_size),
            "--seq-length", length, "--max-position-embeddings", length]
    if model.num_kv_heads is not None and model.num_kv_heads < model.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    flags = {"--swiglu": model.gated_mlp, "--disable-bias-linear": not model.linear_bias,
             "--untie-embeddings-and-output-weights": not model.tied_embeddings}
    args += [flag for flag, wanted in flags.items() if wanted]
    if model.rmsnorm:
        args += ["--normalization", "RMSNorm"]
    if model.norm_eps is not None:
        args += ["--norm-epsilon", f"{model.norm_eps:g}"]
    if model.rotary:
        args += ["--position-embedding-type", "rope"] + _rope_args(model)
    if model.num_experts is not None:
        # Token routing by all-to-all with grouped expert GEMMs, as the cost model prices expert
        # parallelism (Megatron's default all-gather dispatcher moves every token to every rank).
        args += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.moe_top_k),
                 "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
    return args


def _rope_args(model) -> list[str]:
    """Rotary base and scaling (Megatron defaults to base 10000 and no scaling, so leaving them
    out would change the model: Llama 3's base is 500000). ``--rotary-base`` takes an integer;
    Llama 3.1's scaling is ``--use-rope-scaling``, linear position interpolation
    ``--rotary-seq-len-interpolation-factor``.

    Raises:
        ExportError: a base or scaling Megatron-LM's arguments cannot state.
    """
    args = []
    if model.rope_theta is not None:
        if not float(model.rope_theta).is_integer():
            raise ExportError(f"the model's rotary base {model.rope_theta:g} is not a whole "
                              "number, and Megatron-LM's --rotary-base takes an integer; export "
                              "to another target or round the base in model.py.")
        args += ["--rotary-base", str(int(model.rope_theta))]
    kind, factor = model.rope_scaling_type, model.rope_scaling_factor
    if kind == "llama3":
        args += ["--use-rope-scaling", "--rope-scaling-factor", f"{factor:g}"]
    elif kind == "linear" and factor is not None and float(factor).is_integer():
        args += ["--rotary-seq-len-interpolation-factor", str(int(factor))]
    elif kind is not None:
        raise ExportError(f"the model's {kind!r} rope scaling (factor {factor}) has no "
                          "Megatron-LM argument (it has llama3 scaling and whole-number linear "
                          "interpolation); export to another target.")
    return args


def megatron_args(result: Result) -> list[str]:
    """The ``pretrain_gpt.py`` arguments that set up this plan (parallelism, batch, recompute,
    optimizer sharding, model shape, precision); data, tokenizer and optimizer hyper-parameters
    are the user's.

    Raises:
        ExportError: Megatron-LM cannot run the plan (see :func:`check`).
    """
    check(result)
    return (_parallel_args(result) + _batch_args(result) + _recompute_args(result)
            + _optimizer_args(result) + _model_args(result) + _impl_args(result)
            + _precision_args(result))


FP8_ARGS = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len",
            "1024", "--fp8-amax-compute-algo", "max"]
"""FP8 as autoplan prices it (costmodels.fp8): Transformer Engine's hybrid format (E4M3
forward, E5M2 gradients) with delayed scaling over a 1024-step amax history, as Megatron-LM's
examples/llama/train_llama3_8b_h100_fp8.sh runs it (TransformerConfig ``fp8``,
``fp8_recipe``, ``fp8_amax_history_len``, ``fp8_amax_compute_algo``)."""


def _precision_args(result: Result) -> list[str]:
    """``--bf16`` or ``--fp16``; FP8 trains bf16 with TE's FP8 GEMMs (FP8_ARGS), its weights
    FP8 parameters where the distributed optimizer (or Megatron-FSDP) runs
    (``--fp8-param-gather``, as NeMo's bf16_with_fp8_mixed; costmodels.fp8);
    ``--grad-reduce-in-bf16`` where the plan was priced with bf16 gradients."""
    bf16_grads = (["--grad-reduce-in-bf16"] if result.training is not None
                  and result.training.grad_reduce_in_bf16 else [])
    if precision(result) != "fp8":
        return [f"--{precision(result)}", *bf16_grads]
    # Megatron refuses --fp8-param-gather without the distributed optimizer (arguments.py)
    param_gather = ["--fp8-param-gather"] if result.plan.zero_stage >= 1 else []
    return ["--bf16", *bf16_grads, *FP8_ARGS, *param_gather]


def _impl_args(result: Result) -> list[str]:
    """``--transformer-impl`` as the plan was priced (its fused element-wise kernels:
    costmodels.fused_kernels); Megatron-LM's own default, transformer_engine, for a plan that
    does not say (priced by another runtime, or written before the key); and
    ``--tp-comm-overlap`` where the plan was priced with it."""
    training = result.training
    impl = training.transformer_impl if training is not None else None
    overlap = ["--tp-comm-overlap"] if training is not None and training.tp_comm_overlap else []
    return ["--transformer-impl", impl or "transformer_engine", *overlap]


def needs_single_connection(result: Result) -> bool:
    """Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1 (pre-Blackwell), except
    under Megatron-FSDP (ZeRO-2 and 3), which wants more connections."""
    plan = result.plan
    return (plan.tp > 1 or plan.cp > 1) and plan.zero_stage not in MEGATRON_FSDP_STRATEGIES


def _notes(result: Result) -> tuple[str, ...]:
    vocab = require_model(result).vocab_size
    return (
        "Add data, tokenizer, optimizer, schedule and checkpoint arguments yourself"
        + (f"; the tokenizer must give the planned vocabulary of {vocab}" if vocab else "") + ".",
        "Run launch_megatron.sh on every node with MEGATRON_LM set to a Megatron-LM checkout.",
    )


def render(result: Result) -> dict[str, str]:
    """``megatron_args.txt`` and ``launch_megatron.sh``."""
    args = megatron_args(result)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if needs_single_connection(result) else {}
    script = torchrun_script(
        result, header=comment_header(result, title="Megatron-LM launch script (torchrun, one "
                                      "call per node).", notes=_notes(result)),
        required={"MEGATRON_LM": "set MEGATRON_LM to the Megatron-LM checkout with pretrain_gpt.py"},
        env=env, args_file=ARGS_FILE, program='"$MEGATRON_LM"/pretrain_gpt.py')
    header = comment_header(result, title="Megatron-LM pretrain_gpt.py arguments.",
                            notes=_notes(result))
    return {ARGS_FILE: args_file_text(header, args), SCRIPT_FILE: script}


exporter = Exporter(name="megatron", description="Megatron-LM pretrain_gpt.py arguments and "
                    "torchrun launch script", render=render)
