"""Hugging Face accelerate: an ``accelerate launch --config_file`` YAML for DeepSpeed, FSDP2 or
Megatron-LM.

Every field is written out: accelerate fills omitted Megatron-LM fields from environment
defaults that silently change the run (``MegatronLMPlugin`` defaults ``context_parallel_size`` to
2 and ``recompute_granularity`` to full).

The backend is the plan's runtime when accelerate can run the plan with it, else the first of
Megatron-LM, DeepSpeed, FSDP2 that can; each ``_<backend>_section`` raises ExportError naming what
it cannot express.
"""

from __future__ import annotations

from collections.abc import Callable

import yaml

from autoplan.capabilities import OFFLOAD_MIN_ZERO, OFFLOAD_NEEDS
from autoplan.errors import ExportError
from autoplan.plan import Offload, Recompute, Result
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.launch import DEFAULT_MASTER_PORT, nodes_of
from autoplan.plugins.megatron import check as check_megatron
from autoplan.plugins.stages import blocks_per_stage
from autoplan.plugins.summary import comment_header, precision

CONFIG_FILE = "accelerate_config.yaml"


NO_PARTIAL_RECOMPUTE = ("fsdp_activation_checkpointing wraps every block, not the first N of a "
                        "stage (recompute_num_layers); re-plan without --recompute-num-layers")


def _refuse(backend: str, problems: list[str]) -> None:
    if problems:
        raise ExportError(f"accelerate with {backend} cannot run this plan: "
                          + "; ".join(problems) + ".")


def _megatron_section(result: Result) -> dict:
    """``megatron_lm_config``: accelerate has no interleaving, first-stage size or ZeRO-3, and
    only full recompute: ``MegatronLMPlugin`` fills an unset granularity with "full" and an unset
    method with "uniform", which Megatron rejects for selective recompute, and has no "none"."""
    check_megatron(result)
    plan = result.plan
    counts = blocks_per_stage(result)
    middle_even = len(set(counts[:-1])) <= 1
    _refuse("MEGATRON_LM", [problem for problem, bad in (
        ("no interleaved pipeline (vpp must be 1)", plan.vpp > 1),
        ("only the last pipeline stage may differ in size", plan.pp > 1 and not middle_even),
        ("no ZeRO-3", plan.zero_stage == 3),
        ("only full recompute", plan.recompute != Recompute.FULL),
    ) if bad])
    offload = plan.offload == Offload.OPTIMIZER
    section = {
        "megatron_lm_tp_degree": plan.tp,
        "megatron_lm_pp_degree": plan.pp,
        "megatron_lm_context_parallel_size": plan.cp,
        "megatron_lm_num_micro_batches": plan.num_microbatches,
        "megatron_lm_sequence_parallelism": plan.sequence_parallel,
        "megatron_lm_use_distributed_optimizer": plan.zero_stage >= 1 or offload,
        "megatron_lm_optimizer_cpu_offload": offload,
        "megatron_lm_use_precision_aware_optimizer": offload,
        "megatron_lm_overlap_cpu_optimizer_d2h_h2d": offload,
        "megatron_lm_recompute_activations": False,  # the granularity below decides
        "megatron_lm_recompute_granularity": "full",
        # Megatron's own: uniform units of one block, or the first N blocks of each chunk.
        "megatron_lm_recompute_method": "uniform" if plan.recompute_num_layers is None else "block",
        "megatron_lm_recompute_num_layers": plan.recompute_num_layers or 1,
        "megatron_lm_gradient_clipping": 1.0,
    }
    if plan.pp > 1 and counts[-1] != counts[0]:
        section["megatron_lm_decoder_last_pipeline_num_layers"] = counts[-1]
    return {"megatron_lm_config": section}


def _deepspeed_section(result: Result) -> dict:
    """``deepspeed_config``: accelerate drives DeepSpeed's ZeRO engine only (no PP, TP, CP)."""
    plan = result.plan
    _refuse("DEEPSPEED", [problem for problem, bad in (
        ("no pipeline, tensor or context parallelism", plan.pp * plan.tp * plan.cp > 1),
        (OFFLOAD_NEEDS.get(plan.offload), plan.zero_stage < OFFLOAD_MIN_ZERO[plan.offload]),
    ) if bad])
    return {"deepspeed_config": {
        "zero_stage": plan.zero_stage,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "gradient_clipping": 1.0,
        "offload_optimizer_device": "cpu" if plan.offload != Offload.NONE else "none",
        "offload_param_device": "cpu" if plan.offload == Offload.PARAMS else "none",
        "zero3_init_flag": plan.zero_stage == 3,
        "zero3_save_16bit_model": False,
        "deepspeed_multinode_launcher": "standard",
    }}


def _fsdp_section(result: Result) -> dict:
    """``fsdp_config`` (FSDP2) and ``parallelism_config``: ZeRO 1-2 keeps parameters after
    forward, ZeRO-3 reshards them; offload is FSDP2's, covering parameters too."""
    plan = result.plan
    _refuse("FSDP", [problem for problem, bad in (
        ("no pipeline parallelism", plan.pp > 1),
        (NO_PARTIAL_RECOMPUTE, plan.recompute_num_layers is not None),
    ) if bad])
    replicate, shard = (plan.dp, 1) if plan.zero_stage == 0 else (1, plan.dp)
    return {
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": plan.zero_stage == 3,
            "fsdp_offload_params": plan.offload != Offload.NONE,
            "fsdp_activation_checkpointing": plan.recompute != Recompute.NONE,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        },
        "parallelism_config": {
            "parallelism_config_dp_replicate_size": replicate,
            "parallelism_config_dp_shard_size": shard,
            "parallelism_config_tp_size": plan.tp,
            "parallelism_config_cp_size": plan.cp,
        },
    }


BACKENDS: dict[str, Callable[[Result], dict]] = {
    "MEGATRON_LM": _megatron_section, "DEEPSPEED": _deepspeed_section, "FSDP": _fsdp_section}
_RUNTIME_BACKEND = {"megatron": "MEGATRON_LM", "deepspeed": "DEEPSPEED", "fsdp": "FSDP"}


def choose_backend(result: Result) -> tuple[str, dict]:
    """The accelerate ``distributed_type`` and its section, preferring the plan's runtime.

    Raises:
        ExportError: no backend can run the plan (all reasons joined).
    """
    runtime = result.training.runtime if result.training is not None else "megatron"
    preferred = _RUNTIME_BACKEND.get(runtime, "MEGATRON_LM")
    order = [preferred] + [name for name in BACKENDS if name != preferred]
    reasons = []
    for name in order:
        try:
            return name, BACKENDS[name](result)
        except ExportError as err:
            reasons.append(str(err))
    raise ExportError(" ".join(reasons))


def accelerate_config(result: Result) -> dict:
    """The ``accelerate launch --config_file`` mapping, every field explicit.

    Raises:
        ExportError: no accelerate backend can run the plan.
    """
    _refuse("any backend", capability_problems(result, "accelerate"))
    distributed_type, section = choose_backend(result)
    nodes = nodes_of(result)
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed_type,
        "num_machines": nodes.num_nodes,
        "num_processes": result.plan.world_size,
        "machine_rank": 0,
        "main_process_ip": nodes.master_ip,
        "main_process_port": DEFAULT_MASTER_PORT,
        "rdzv_backend": "static",
        "same_network": True,
        "gpu_ids": "all",
        "mixed_precision": precision(result),
        "downcast_bf16": "no",
        "use_cpu": False,
        "debug": False,
        "main_training_function": "main",
        "enable_cpu_affinity": False,
        **section,
    }


def render(result: Result) -> dict[str, str]:
    """``accelerate_config.yaml``."""
    config = accelerate_config(result)
    notes = (f"Backend: {config['distributed_type']}. Run 'accelerate launch --config_file "
             f"{CONFIG_FILE} --machine_rank N train.py' on node N (host order of cluster.yaml)"
             + ("" if config["main_process_ip"] else ", adding --main_process_ip of node 0")
             + ".",
             f"accelerate takes the micro-batch from the DataLoader: use batch_size="
             f"{result.plan.micro_batch_size} per process.")
    header = comment_header(result, title="accelerate launch configuration.", notes=notes)
    return {CONFIG_FILE: header + yaml.safe_dump(config, sort_keys=False)}


exporter = Exporter(name="accelerate", description="accelerate launch config (DeepSpeed, FSDP2 "
                    "or Megatron-LM)", render=render)
