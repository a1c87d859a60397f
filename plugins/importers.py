"""Read a configuration users already run: a Megatron-LM argument list (or a launch script that
holds one), a DeepSpeed ``ds_config.json``, or torchtitan CLI overrides, into the pins of a
plan, so ``autoplan estimate --from FILE`` prices the current setup and ``autoplan solve --from
FILE`` says how much faster the optimum is. Exporting a plan and importing it back gives the
same plan.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from autoplan.errors import PlanFileError
from autoplan.plugins.megatron import MEGATRON_FSDP_STRATEGIES
from autoplan.training import PIPELINE_INSIDE_PLACEMENT


@dataclass(frozen=True)
class ImportedRun:
    """What a configuration file fixes: pins by the CLI's names, and training settings."""

    framework: str
    pins: dict = field(default_factory=dict)
    seq_len: int | None = None
    global_batch: int | None = None
    precision: str | None = None
    runtime: str = "megatron"
    first_stage_blocks: int | None = None  # Megatron's uneven first/last stages
    last_stage_blocks: int | None = None
    notes: tuple[str, ...] = ()  # what was inferred from fields the file leaves out
    # fields of the runtime's profile the file sets (autoplan.problems.runtime_with)
    runtime_settings: dict = field(default_factory=dict)


def _tokens(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return shlex.split(" ".join(lines).replace("\\ ", " "))


def _flags(tokens: list[str]) -> dict[str, str | bool]:
    """``--name value`` pairs and bare ``--switch`` flags."""
    flags: dict[str, str | bool] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        name, _, inline = token[2:].partition("=")
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if inline:
            flags[name] = inline
        elif following is not None and not following.startswith("--"):
            flags[name] = following
        else:
            flags[name] = True
    return flags


def _int(flags: dict, name: str) -> int | None:
    value = flags.get(name)
    if value is None or value is True:
        return None
    try:
        return int(value)
    except ValueError:
        raise PlanFileError(f"--{name} {value!r} is not a whole number.") from None


def _recompute_num_layers(flags: dict) -> int | None:
    """``--recompute-method block --recompute-num-layers N`` recomputes the first N blocks of
    each chunk; ``uniform`` recomputes all of them (in units of N, which the model does not
    distinguish from units of one)."""
    if flags.get("recompute-granularity") != "full" or flags.get("recompute-method") != "block":
        return None
    return _int(flags, "recompute-num-layers")


def _megatron_zero(flags: dict) -> int:
    """ZeRO stage of a Megatron-LM run: Megatron-FSDP's sharding strategy (its default
    optim_grads_params where the flag is absent; no_shard and optim, which keep gradients
    whole, are priced as ZeRO-0 and ZeRO-1), else 1 with the distributed optimizer, 0
    without."""
    if flags.get("use-megatron-fsdp"):
        strategy = flags.get("data-parallel-sharding-strategy") or "optim_grads_params"
        stages = {"no_shard": 0, "optim": 1,
                  **{name: zero for zero, name in MEGATRON_FSDP_STRATEGIES.items()}}
        if strategy not in stages:
            raise PlanFileError(f"--data-parallel-sharding-strategy {strategy!r} is not one of "
                                f"Megatron-LM's choices: {', '.join(stages)}.")
        return stages[strategy]
    return 1 if flags.get("use-distributed-optimizer") else 0


def _megatron(flags: dict) -> ImportedRun:
    pins = {"tp": _int(flags, "tensor-model-parallel-size"),
            "pp": _int(flags, "pipeline-model-parallel-size"),
            "cp": _int(flags, "context-parallel-size"), "mbs": _int(flags, "micro-batch-size"),
            "vpp": _int(flags, "num-virtual-stages-per-pipeline-rank"),
            "sp": True if flags.get("sequence-parallel") else None,
            "zero": _megatron_zero(flags),
            "recompute": flags.get("recompute-granularity") or "none",
            "recompute_num_layers": _recompute_num_layers(flags),
            "offload": "optimizer" if flags.get("optimizer-cpu-offload") else None,
            "placement": PIPELINE_INSIDE_PLACEMENT if flags.get("use-tp-pp-dp-mapping") else None,
            "ep": _int(flags, "expert-model-parallel-size")}
    precision = "bf16" if flags.get("bf16") else "fp16" if flags.get("fp16") else None
    if flags.get("fp8-format"):  # Transformer Engine's FP8 over bf16 (costmodels.fp8)
        precision = "fp8"
    settings, notes = _megatron_settings(flags)
    return ImportedRun("megatron", {k: v for k, v in pins.items() if v is not None},
                       seq_len=_int(flags, "seq-length"),
                       global_batch=_int(flags, "global-batch-size"), precision=precision,
                       runtime="megatron",
                       first_stage_blocks=_int(flags, "decoder-first-pipeline-num-layers"),
                       last_stage_blocks=_int(flags, "decoder-last-pipeline-num-layers"),
                       notes=notes, runtime_settings=settings)


def _megatron_settings(flags: dict) -> tuple[dict, tuple[str, ...]]:
    """The megatron runtime's fields the arguments set, and notes: ``--transformer-impl``,
    ``--grad-reduce-in-bf16`` and ``--tp-comm-overlap`` (Transformer Engine's userbuffers,
    costmodels.tp_overlap). A ``--tp-comm-overlap-cfg`` file is not read: the overlap is
    priced with TE's defaults."""
    settings, notes = {}, []
    impl = flags.get("transformer-impl")
    if isinstance(impl, str):
        settings["transformer_impl"] = impl
    if flags.get("grad-reduce-in-bf16"):
        settings["grad_reduce_in_bf16"] = True
    if flags.get("tp-comm-overlap"):
        settings["tp_comm_overlap"] = True
        if flags.get("tp-comm-overlap-cfg"):
            notes.append("--tp-comm-overlap-cfg not read: the TP overlap is priced with "
                         "Transformer Engine's default userbuffers settings")
    return settings, tuple(notes)


def _torchtitan(tokens: list[str], flags: dict) -> ImportedRun:
    shard = _int(flags, "parallelism.data_parallel_shard_degree") or 1
    replicate = _int(flags, "parallelism.data_parallel_replicate_degree") or 1
    mode = next((t.split(":", 1)[1] for t in tokens if t.startswith("activation_checkpoint:")),
                "none")
    reshard = flags.get("parallelism.fsdp_reshard_after_forward", "default")
    pins = {"tp": _int(flags, "parallelism.tensor_parallel_degree"),
            "pp": _int(flags, "parallelism.pipeline_parallel_degree"),
            "cp": _int(flags, "parallelism.context_parallel_degree"),
            "dp": shard * replicate,
            "sp": True if flags.get("parallelism.enable_sequence_parallel") else None,
            "mbs": _int(flags, "parallelism.pipeline_parallel_microbatch_size"),
            "zero": 0 if shard == 1 else (2 if reshard == "never" else 3),
            "recompute": mode if mode in ("none", "selective", "full") else "none",
            "ep": _int(flags, "parallelism.expert_parallel_degree")}
    return ImportedRun("torchtitan", {k: v for k, v in pins.items() if v is not None},
                       seq_len=_int(flags, "training.seq_len"),
                       global_batch=_int(flags, "training.global_batch_size"), runtime="fsdp")


def _batch_field(config: dict, name: str) -> int | None:
    """A ds_config batch field: an integer, or None when absent or "auto" (the HF Trainer's
    default, which it fills from the run's own settings: here --global-batch, --mbs and the
    cluster)."""
    value = config.get(name)
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanFileError(f"ds_config.json: {name} is {value!r}; give a positive integer or "
                            "\"auto\".")
    return value


def _deepspeed_batch(config: dict) -> tuple[int | None, dict, list[str]]:
    """(train_batch_size, pins, notes) as DeepSpeed resolves them (runtime/config.py
    _set_batch_related_parameters, _batch_assertion): train_batch_size = micro_batch *
    gradient_accumulation_steps * dp; a field left out (or "auto") follows from the others
    once dp, the GPUs not used by TP and PP, is known."""
    batch = _batch_field(config, "train_batch_size")
    mbs = _batch_field(config, "train_micro_batch_size_per_gpu")
    accumulation = _batch_field(config, "gradient_accumulation_steps")
    if not {"train_batch_size", "train_micro_batch_size_per_gpu"} & config.keys():
        raise PlanFileError("ds_config.json: give train_batch_size or "
                            "train_micro_batch_size_per_gpu (DeepSpeed needs one of them; \"auto\" "
                            "takes --global-batch and --mbs).")
    if batch is not None and mbs is not None and accumulation is not None:
        if batch % (mbs * accumulation):
            raise PlanFileError(
                f"ds_config.json: train_batch_size {batch} is not micro_batch {mbs} x "
                f"gradient_accumulation_steps {accumulation} x a data-parallel degree, as "
                "DeepSpeed requires.")
        return batch, {"mbs": mbs, "dp": batch // (mbs * accumulation)}, []
    notes = []
    if mbs is not None and accumulation is None:
        notes.append("gradient_accumulation_steps inferred as DeepSpeed does: train_batch_size "
                     "/ (micro_batch x dp), dp from the cluster")
    if batch is None:
        notes.append("train_batch_size not stated (or \"auto\"): taken from --global-batch")
    if mbs is None:
        notes.append("train_micro_batch_size_per_gpu not stated (or \"auto\"): from --mbs, "
                     "else 1")
    return batch, {"mbs": mbs}, notes


def _deepspeed(config: dict) -> ImportedRun:
    batch, batch_pins, notes = _deepspeed_batch(config)
    zero = config.get("zero_optimization", {})
    offload = "params" if zero.get("offload_param", {}).get("device") == "cpu" else (
        "optimizer" if zero.get("offload_optimizer", {}).get("device") == "cpu" else "none")
    pins = {**batch_pins, "zero": zero.get("stage", 0),
            "offload": offload,
            "recompute": "full" if "activation_checkpointing" in config else "none",
            "pp": config.get("pipeline", {}).get("stages"),
            "tp": config.get("tensor_parallel", {}).get("autotp_size")}
    precision = "bf16" if config.get("bf16", {}).get("enabled") else (
        "fp16" if config.get("fp16", {}).get("enabled") else None)
    return ImportedRun("deepspeed", {k: v for k, v in pins.items() if v is not None},
                       global_batch=batch, precision=precision, runtime="deepspeed",
                       notes=tuple(notes))


def read_run(path: str | Path) -> ImportedRun:
    """Recognise and read a Megatron-LM, DeepSpeed or torchtitan configuration file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise PlanFileError(f"{path}: cannot be read ({err.strerror}).") from None
    if text.lstrip().startswith("{"):
        try:
            return _deepspeed(json.loads(text))
        except json.JSONDecodeError as err:
            raise PlanFileError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}).") from None
    try:
        tokens = _tokens(text)
    except ValueError as err:
        raise PlanFileError(f"{path}: cannot split into arguments ({err}).") from None
    flags = _flags(tokens)
    if "tensor-model-parallel-size" in flags or "pipeline-model-parallel-size" in flags:
        return _megatron(flags)
    if any(name.startswith("parallelism.") for name in flags):
        return _torchtitan(tokens, flags)
    raise PlanFileError(
        f"{path}: not a configuration autoplan reads. Give a Megatron-LM argument list or launch "
        "script (with --tensor-model-parallel-size ...), a DeepSpeed ds_config.json, or "
        "torchtitan overrides (--parallelism....).")
