"""What each runtime and each export target can run: one table each, read by the search space
(``search/space.py``: it never proposes what the runtime cannot run) and by every exporter's
``check()`` (``plugins/``: it refuses what its target cannot run), so the two cannot drift.

A runtime is what autoplan prices (a cost-model profile, ``costmodels/profiles.yaml``) and
exports through its own target: Megatron-LM -> ``megatron``, DeepSpeed -> ``deepspeed``
(ds_config.json, plus Megatron-DeepSpeed arguments for TP or pipelines), FSDP -> ``torchtitan``.
A runtime's table is its target's, narrowed where the cost model does not price a mode the
target has (Megatron-FSDP's ZeRO-3; uneven interleaving outside Megatron).

Facts, from the frameworks' own code (the versions installed as test dependencies):

- DeepSpeed: the pipeline engine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
  parallelism" (``runtime/pipe/engine.py``) and has 1F1B (``TrainSchedule``) but no
  interleaved schedule (``runtime/pipe/schedule.py``); AutoTP (``tensor_parallel.autotp_size``)
  runs with every ZeRO stage including 3 ("AutoTP + ZeRO stage 3 is supported for both inference
  and training", ``runtime/engine.py``); TP inside a pipeline is Megatron-DeepSpeed's (Megatron
  TP modules, DeepSpeed's PipelineModule). Ulysses sequence parallelism is not ring attention.
- torchtitan 0.3: FSDP2 ``fully_shard`` (reshard after forward or not), DDP replicate; CPU
  offload is FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer state together:
  ``training.enable_cpu_offload``); schedules of torch.distributed.pipelining (1F1B,
  Interleaved1F1B, InterleavedZeroBubble), which need at least as many micro-batches as stages
  (``schedules.py``: "n_microbatches < self._num_stages"); CP, EP (experts not TP-split, EP
  ranks borrowed from the FSDP shards), TP with sequence parallel; mixed precision bf16 only.
- Megatron-LM (megatron-core 0.16): distributed optimizer (ZeRO-1), Megatron-FSDP
  (``--use-megatron-fsdp``: ``--data-parallel-sharding-strategy optim_grads`` is ZeRO-2,
  ``optim_grads_params`` ZeRO-3), interleaving (``--num-virtual-stages-per-pipeline-rank``)
  and uneven layouts, both rank orders, CP, EP (needs SP with TP), partial recompute; no
  parameter offload (``--optimizer-cpu-offload`` moves optimizer state only). FP8 through
  Transformer Engine (``--fp8-format hybrid``); the FSDP runtime runs FP8 as llm-foundry's
  Composer ``precision: amp_fp8`` does (TE layers under ``fp8_autocast``), which torchtitan's
  exporter does not write (its float8 is torchao's).
- torchtune 0.6.1 (``recipes/*.py``): FSDP2 ``fully_shard`` on every rank of its distributed
  recipes ("DDP is currently not supported"), resharding after forward or not
  (``fsdp_reshard_after_forward``), CPU offload as CPUOffloadPolicy (``fsdp_cpu_offload``);
  TP (``tensor_parallel_dim``) in ``full_finetune_distributed`` only, Colwise/Rowwise without
  sequence parallelism (``base_llama_tp_plan``); no pipeline, context or expert parallelism;
  activation checkpointing of whole blocks; ``optimizer_in_bwd`` in its full fine-tune recipes,
  which raise on gradient accumulation; LoRA and QLoRA recipes; bf16 only ("full fp16 training
  is not supported with this recipe").
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from dataclasses import dataclass, field, replace

from autoplan.errors import ConstraintError
from autoplan.plan import Offload, PipelineSchedule, Plan, Recompute
from autoplan.training import DEFAULT_PLACEMENT, KNOWN_PLACEMENTS, Pins, Runtime


@dataclass(frozen=True)
class Capabilities:
    """What one runtime or export target runs. ``notes`` replace the generic phrase of a gap
    (keyed like :func:`plan_gaps`'s keys) with the target's own explanation."""

    name: str
    zero_stages: tuple[int, ...]
    pipeline_zero_stages: tuple[int, ...]
    zero3_with_tp: bool
    offloads: tuple[Offload, ...]
    interleaving: bool
    uneven_interleaving: bool
    placements: tuple[str, ...]
    zero_bubble: bool
    context_parallel: bool
    expert_parallel: bool
    expert_parallel_with_tp: bool
    expert_parallel_needs_sharding: bool
    ep_with_tp_needs_sp: bool
    sequence_parallel: bool
    partial_recompute: bool
    node_groups: bool
    precisions: tuple[str, ...]
    pipeline_needs_microbatches: bool
    """A pipeline needs at least pp micro-batches (torch.distributed.pipelining)."""
    notes: dict[str, str] = field(default_factory=dict)
    tp_implies_sp: bool = False
    """TP always comes with sequence parallelism: torchtitan's parallelize plan (``apply_tp``:
    norms ``SequenceParallel``, attention/MLP inputs ``Shard(1)`` -> ``Replicate``, outputs back
    to ``Shard(1)``) has no TP without SP."""
    optimizer_in_backward: bool = False
    """Steps each parameter's optimizer from its post-accumulate-grad hook (torchtune's
    ``optimizer_in_bwd``); a runtime that has it prices gradients as one layer's."""
    pipeline: bool = True
    """Runs pipeline parallelism (pp > 1)."""
    replicated_dp: bool = True
    """Runs replicated data parallelism (DDP: dp > 1 at ZeRO-0)."""
    selective_recompute: bool = True
    """Recomputes parts of a block (selective), not only whole blocks."""
    asked_zero_stages: tuple[int, ...] = ()
    """ZeRO stages the runtime runs and prices that the search proposes only when asked for
    (pins ``zero``, ``--zero``) or when no other stage fits (search.solve.solve_search)."""


MEGATRON_TARGET = Capabilities(
    name="Megatron-LM", zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1, 2, 3),
    zero3_with_tp=True, offloads=(Offload.OPTIMIZER,), interleaving=True,
    uneven_interleaving=True, placements=KNOWN_PLACEMENTS, zero_bubble=False,
    context_parallel=True, expert_parallel=True, expert_parallel_with_tp=True,
    expert_parallel_needs_sharding=False, ep_with_tp_needs_sp=True, sequence_parallel=True,
    partial_recompute=True, node_groups=True, precisions=("bf16", "fp16", "fp8"),
    pipeline_needs_microbatches=False,
    notes={"offload_params": "Megatron-LM cannot offload parameters to CPU (only optimizer "
                             "state)"})

DEEPSPEED_TARGET = Capabilities(
    name="DeepSpeed", zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1),
    zero3_with_tp=True, offloads=(Offload.OPTIMIZER, Offload.PARAMS), interleaving=False,
    uneven_interleaving=False, placements=(DEFAULT_PLACEMENT,), zero_bubble=False,
    context_parallel=False, expert_parallel=False, expert_parallel_with_tp=False,
    expert_parallel_needs_sharding=False, ep_with_tp_needs_sp=False, sequence_parallel=False,
    partial_recompute=False, node_groups=False, precisions=("bf16", "fp16"),
    pipeline_needs_microbatches=False,
    notes={"interleaving": "its pipeline engine has no interleaved schedule (vpp must be 1)",
           "pipeline_zero": "its pipeline engine does not run ZeRO-2 or ZeRO-3; re-plan with "
                            "--zero 1 or --pp 1",
           "context_parallel": "context parallelism (Ulysses) is set up in model code, not in "
                               "ds_config",
           "partial_recompute": "its activation checkpointing covers every layer, not the "
                                "first N of each stage: re-plan without --recompute-num-layers "
                                "(recompute_num_layers)"})

TORCHTITAN_TARGET = Capabilities(
    name="torchtitan", zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1, 2, 3),
    zero3_with_tp=True, offloads=(Offload.OPTIMIZER, Offload.PARAMS), interleaving=True,
    uneven_interleaving=True, placements=(DEFAULT_PLACEMENT,), zero_bubble=True,
    context_parallel=True, expert_parallel=True, expert_parallel_with_tp=False,
    expert_parallel_needs_sharding=True, ep_with_tp_needs_sp=False, sequence_parallel=True,
    partial_recompute=False, node_groups=False, precisions=("bf16",),
    pipeline_needs_microbatches=True, tp_implies_sp=True,
    notes={"partial_recompute": "activation_checkpoint full covers every block "
                                "(selective_ac_option picks every k-th, not the first N of a "
                                "stage): re-plan without --recompute-num-layers "
                                "(recompute_num_layers)",
           "precision": "its mixed precision is bf16 only (training.mixed_precision_param)",
           "ep_tp": "torchtitan's experts are not split by TP as planned; re-plan with --tp 1",
           "ep_sharding": "expert parallelism borrows FSDP-sharded ranks, which ZeRO-0 "
                          "(replicated data parallelism) has none of; re-plan with --zero 2 or "
                          "3"})
"""ZeRO-1 and optimizer offload are exported as their nearest FSDP2 modes (shard without
resharding; CPUOffloadPolicy, which also moves parameters): they run in no more memory."""

COLOSSALAI_TARGET = Capabilities(
    name="Colossal-AI's HybridParallelPlugin", zero_stages=(0, 1, 2), pipeline_zero_stages=(0, 1),
    zero3_with_tp=False, offloads=(Offload.OPTIMIZER,), interleaving=True,
    uneven_interleaving=False, placements=(DEFAULT_PLACEMENT,), zero_bubble=False,
    context_parallel=True, expert_parallel=False, expert_parallel_with_tp=False,
    expert_parallel_needs_sharding=False, ep_with_tp_needs_sp=False, sequence_parallel=True,
    partial_recompute=False, node_groups=False, precisions=("bf16", "fp16"),
    pipeline_needs_microbatches=False,
    notes={"zero3": "ZeRO-3 is the GeminiPlugin, not HybridParallelPlugin",
           "pipeline_zero": "a pipeline runs with ZeRO stage 0 or 1 only",
           "offload_params": "parameter offload needs the GeminiPlugin",
           "uneven_interleaving": "uneven interleaved stages cannot be given "
                                  "(num_layers_per_stage is per rank)",
           "partial_recompute": "recomputing only the first N blocks of each stage "
                                "(recompute_num_layers) is not expressed by this exporter; "
                                "re-plan without --recompute-num-layers"})

TORCHRUN_TARGET = Capabilities(
    name="the torchrun script", zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1, 2, 3),
    zero3_with_tp=True, offloads=(), interleaving=True, uneven_interleaving=True,
    placements=KNOWN_PLACEMENTS, zero_bubble=False, context_parallel=False,
    expert_parallel=False, expert_parallel_with_tp=False, expert_parallel_needs_sharding=False,
    ep_with_tp_needs_sp=False, sequence_parallel=True, partial_recompute=True, node_groups=True,
    precisions=("bf16", "fp16"), pipeline_needs_microbatches=False,
    notes={"context_parallel": "context parallelism (cp > 1) is not built by train.py",
           "offload_optimizer": "CPU offload is not built by train.py",
           "offload_params": "CPU offload is not built by train.py"})

ACCELERATE_TARGET = Capabilities(
    name="accelerate", zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1, 2),
    zero3_with_tp=True, offloads=(Offload.OPTIMIZER, Offload.PARAMS), interleaving=False,
    uneven_interleaving=False, placements=(DEFAULT_PLACEMENT,), zero_bubble=False,
    context_parallel=True, expert_parallel=False, expert_parallel_with_tp=False,
    expert_parallel_needs_sharding=False, ep_with_tp_needs_sp=False, sequence_parallel=True,
    partial_recompute=True, node_groups=False, precisions=("bf16", "fp16"),
    pipeline_needs_microbatches=False)
"""What some accelerate backend runs; which one runs a plan is ``plugins.accelerate``'s
backend choice (each backend's own limits are checked there)."""

TORCHTUNE_TARGET = Capabilities(
    name="torchtune", zero_stages=(0, 2, 3), pipeline_zero_stages=(0, 2, 3), zero3_with_tp=True,
    offloads=(Offload.PARAMS,), interleaving=False, uneven_interleaving=False,
    placements=(DEFAULT_PLACEMENT,), zero_bubble=False, context_parallel=False,
    expert_parallel=False, expert_parallel_with_tp=False, expert_parallel_needs_sharding=False,
    ep_with_tp_needs_sp=False, sequence_parallel=False, partial_recompute=False,
    node_groups=False, precisions=("bf16",), pipeline_needs_microbatches=False,
    optimizer_in_backward=True, pipeline=False, replicated_dp=False, selective_recompute=False,
    notes={"zero1": "its data parallelism is FSDP2 sharding, which shards gradients too; "
                    "re-plan with --zero 2 or 3",
           "offload_optimizer": "its CPU offload (fsdp_cpu_offload, FSDP2's CPUOffloadPolicy) "
                                "moves parameters, gradients and optimizer state together; "
                                "re-plan with --offload params --zero 3",
           "sequence_parallel": "its tensor-parallel plan (base_llama_tp_plan) has no sequence "
                                "parallelism; re-plan with --no-sp (on a runtime that has TP "
                                "without SP) or --tp 1",
           "partial_recompute": "enable_activation_checkpointing wraps every block; re-plan "
                                "without --recompute-num-layers (recompute_num_layers)",
           "precision": "its recipes train in bf16 only (dtype=bf16)",
           "pipeline": "its recipes have no pipeline parallelism; re-plan with --pp 1",
           "replicated_dp": "its data parallelism is FSDP2 sharding (\"DDP is currently not "
                            "supported\"); re-plan with --zero 2 or 3",
           "selective_recompute": "enable_activation_checkpointing wraps whole blocks; re-plan "
                                  "with --recompute full or none"})
"""Which recipe, and what its recipes cannot run beyond this table (TP in LoRA recipes, an
int8 base, frozen weights without adapters), is ``plugins.torchtune``'s."""

TARGETS: dict[str, Capabilities] = {
    "megatron": MEGATRON_TARGET, "deepspeed": DEEPSPEED_TARGET, "torchtitan": TORCHTITAN_TARGET,
    "colossalai": COLOSSALAI_TARGET, "torchrun": TORCHRUN_TARGET, "accelerate": ACCELERATE_TARGET,
    "torchtune": TORCHTUNE_TARGET}

RUNTIME_TARGET = {Runtime.MEGATRON: "megatron", Runtime.DEEPSPEED: "deepspeed",
                  Runtime.FSDP: "torchtitan"}
"""The export target that runs each runtime's plans."""

TARGET_RUNTIME = {"megatron": Runtime.MEGATRON, "deepspeed": Runtime.DEEPSPEED,
                  "torchtitan": Runtime.FSDP, "torchrun": Runtime.FSDP, "torchtune": Runtime.FSDP}
"""The runtime whose cost model prices a target's files (torchrun's train.py is FSDP2 and
torch.distributed.pipelining, like torchtitan; torchtune's recipes are FSDP2). accelerate is priced as its chosen backend;
Colossal-AI has no cost model of its own."""

RUNTIMES: dict[Runtime, Capabilities] = {
    Runtime.MEGATRON: replace(
        MEGATRON_TARGET, zero_stages=(0, 1, 2), pipeline_zero_stages=(0, 1, 2),
        asked_zero_stages=(2,),
        notes={**MEGATRON_TARGET.notes,
               "zero3": "Megatron-LM runs ZeRO-3 as Megatron-FSDP's optim_grads_params, which "
                        "autoplan does not price"}),
    Runtime.DEEPSPEED: DEEPSPEED_TARGET,
    Runtime.FSDP: replace(TORCHTITAN_TARGET, name="FSDP", zero_stages=(0, 2, 3),
                          offloads=(Offload.PARAMS,), uneven_interleaving=False,
                          optimizer_in_backward=True, precisions=("bf16", "fp8")),
}
"""What the search proposes per runtime: its target's table, narrowed to what the cost model
prices. Megatron-LM's ZeRO is its distributed optimizer (ZeRO-1) and Megatron-FSDP's
optim_grads (ZeRO-2: gradients reduce-scattered every micro-batch, parameters whole; its
ZeRO-3 is not modelled), searched only when asked for or when nothing else fits
(``asked_zero_stages``): it moves a Megatron-LM launch to Megatron-FSDP (fsdp_dtensor
checkpoints, no fused gradient accumulation), and no published run it was checked on ran it.
FSDP's ZeRO is SHARD_GRAD_OP (2) and FULL_SHARD (3), its offload CPUOffloadPolicy
(parameters too, so ZeRO-3 with parameter offload); sequence parallelism comes with every TP
plan of FSDP (``tp_implies_sp``) and is a searched choice on Megatron-LM only; uneven
interleaving is searched for Megatron-LM only. The optimizer in backward is priced on FSDP only:
torchtune's FSDP2 recipes have it (the ``torchtune`` target); torchtitan 0.3, DeepSpeed and
Megatron-LM step after the whole backward."""


def require_in_backward_runtime(runtime: Runtime) -> None:
    """Refuse an optimizer in backward on a runtime that has none.

    Raises:
        ConstraintError: naming the runtimes that have it.
    """
    if not RUNTIMES[runtime].optimizer_in_backward:
        have = [r for r in Runtime if RUNTIMES[r].optimizer_in_backward]
        raise ConstraintError(
            f"--optimizer-in-backward --runtime {runtime.value}: {RUNTIMES[runtime].name} steps "
            f"the optimizer after the whole backward (it has no per-parameter step in backward); "
            f"{names(have)} {'has' if len(have) == 1 else 'have'} it (torchtune's "
            f"optimizer_in_bwd). Use --runtime {have[0].value} (or auto) or leave "
            "--optimizer-in-backward unset.")


def accumulation_gap(plan: Plan) -> str | None:
    """Why the optimizer cannot step in backward with ``plan``, or None: torchtune raises
    "Gradient accumulation is not supported with optimizer in bwd" when
    gradient_accumulation_steps > 1 (each gradient is applied and freed as it is complete, so
    there is nothing to accumulate into)."""
    if plan.num_microbatches == 1:
        return None
    return (f"the optimizer in backward cannot accumulate gradients over "
            f"{plan.num_microbatches} micro-batches per step; make micro-batch x DP equal the "
            f"global batch ({plan.global_batch_size})")


def require_no_accumulation(plan: Plan) -> None:
    """Refuse a plan that accumulates gradients under an optimizer in backward.

    Raises:
        ConstraintError: saying what to change.
    """
    gap = accumulation_gap(plan)
    if gap:
        raise ConstraintError(f"--optimizer-in-backward: {gap}, or leave "
                              "--optimizer-in-backward unset.")


OFFLOAD_MIN_ZERO = {Offload.NONE: 0, Offload.OPTIMIZER: 1, Offload.PARAMS: 3}
"""The least ZeRO stage each offload runs with, in every runtime and target: the optimizer
state moved to CPU is the sharded one (ZeRO >= 1), parameters move only when sharded (ZeRO-3)."""
OFFLOAD_NEEDS = {Offload.OPTIMIZER: "optimizer offload needs ZeRO stage 1 or more",
                 Offload.PARAMS: "parameter offload needs ZeRO stage 3"}


def _zero_gaps(caps: Capabilities, plan: Plan) -> list[tuple[str, str]]:
    z, gaps = plan.zero_stage, []
    if z not in caps.zero_stages:
        gaps.append((f"zero{z}", f"no ZeRO-{z}"))
    elif plan.pp > 1 and z not in caps.pipeline_zero_stages:
        gaps.append(("pipeline_zero", f"no ZeRO-{z} with a pipeline (pp={plan.pp})"))
    if z == 3 and plan.tp > 1 and not caps.zero3_with_tp:
        gaps.append(("zero3_tp", "no ZeRO-3 together with tensor parallelism"))
    if z < OFFLOAD_MIN_ZERO[plan.offload]:
        gaps.append(("offload_zero", OFFLOAD_NEEDS[plan.offload]))
    if plan.offload is not Offload.NONE and plan.offload not in caps.offloads:
        gaps.append((f"offload_{plan.offload.value}", f"no {plan.offload.value} offload to CPU"))
    return gaps


def _pipeline_gaps(caps: Capabilities, plan: Plan, uneven: bool) -> list[tuple[str, str]]:
    gaps = []
    if plan.vpp > 1 and not caps.interleaving:
        gaps.append(("interleaving", "no interleaved pipeline schedule (vpp must be 1)"))
    elif plan.vpp > 1 and uneven and not caps.uneven_interleaving:
        gaps.append(("uneven_interleaving", "no uneven interleaved stages"))
    if plan.pipeline_schedule is PipelineSchedule.ZERO_BUBBLE and not caps.zero_bubble:
        gaps.append(("zero_bubble", "no zero-bubble pipeline schedule"))
    if plan.pp > 1 and caps.pipeline_needs_microbatches and plan.num_microbatches < plan.pp:
        gaps.append(("microbatches", f"{plan.num_microbatches} micro-batches cannot fill "
                                     f"{plan.pp} stages"))
    return gaps


def _parallel_gaps(caps: Capabilities, plan: Plan) -> list[tuple[str, str]]:
    gaps = []
    if plan.cp > 1 and not caps.context_parallel:
        gaps.append(("context_parallel", "no ring-attention context parallelism (cp > 1)"))
    if plan.sequence_parallel and not caps.sequence_parallel:
        gaps.append(("sequence_parallel", "no Megatron-style sequence parallelism"))
    if plan.ep > 1 and not caps.expert_parallel:
        gaps.append(("expert_parallel", f"no expert parallelism (ep={plan.ep})"))
    elif plan.ep > 1:
        if plan.tp > 1 and not caps.expert_parallel_with_tp:
            gaps.append(("ep_tp", f"no expert parallelism with TP (ep={plan.ep}, tp={plan.tp})"))
        if plan.zero_stage == 0 and caps.expert_parallel_needs_sharding:
            gaps.append(("ep_sharding", "expert parallelism needs sharded data parallelism"))
        if plan.tp > 1 and caps.ep_with_tp_needs_sp and not plan.sequence_parallel:
            gaps.append(("ep_sp", f"ep={plan.ep} with tp={plan.tp} needs sequence parallelism"))
    if plan.recompute_num_layers is not None and not caps.partial_recompute:
        gaps.append(("partial_recompute", "no recompute of only the first N blocks of each "
                                          "chunk (recompute_num_layers)"))
    return gaps


def plan_gaps(caps: Capabilities, plan: Plan, precision: str = "bf16", *,
              uneven: bool = False) -> list[str]:
    """Why ``caps`` cannot run ``plan`` (empty: it can), one phrase each, the target's own
    words where it has them. ``uneven``: the plan's model chunks hold different block counts.
    Rank order and node groups are checked by ``plugins.launch.require_target_placement``."""
    gaps = _zero_gaps(caps, plan) + _pipeline_gaps(caps, plan, uneven) + _parallel_gaps(caps, plan)
    if precision not in caps.precisions:
        gaps.append(("precision", f"no {precision} training ({' and '.join(caps.precisions)} "
                                  "only)"))
    gaps += _mode_gaps(caps, plan)
    return [caps.notes.get(key, phrase) for key, phrase in gaps]


def _mode_gaps(caps: Capabilities, plan: Plan) -> list[tuple[str, str]]:
    """Whole modes a target lacks: pipelines, replicated data parallelism, selective
    recompute (torchtune's recipes)."""
    gaps = []
    if plan.pp > 1 and not caps.pipeline:
        gaps.append(("pipeline", f"no pipeline parallelism (pp={plan.pp})"))
    if plan.dp > 1 and plan.zero_stage == 0 and not caps.replicated_dp:
        gaps.append(("replicated_dp", "no replicated data parallelism (dp > 1 at ZeRO-0)"))
    if plan.recompute is Recompute.SELECTIVE and not caps.selective_recompute:
        gaps.append(("selective_recompute", "no selective recompute"))
    return gaps


def can_run(caps: Capabilities, plan: Plan, precision: str = "bf16", *,
            uneven: bool = False) -> bool:
    """Whether ``caps`` runs ``plan`` whole: its gaps, rank order and node groups."""
    placed = caps.node_groups if plan.stage_groups is not None else plan.placement in caps.placements
    return placed and not plan_gaps(caps, plan, precision, uneven=uneven)


@dataclass(frozen=True)
class Feature:
    """Something the pins ask of a runtime: ``label`` as a sentence names it, ``flags`` the
    options that ask for it, ``has`` whether a table has it, ``key`` the gap key (as
    :func:`plan_gaps` keys them) under which a table's ``notes`` say why it lacks it."""

    label: str
    flags: str
    has: Callable[[Capabilities], bool]
    key: str = ""


def pinned_features(pins: Pins, precision: str = "bf16", *,
                    node_groups: bool = False) -> list[Feature]:
    """The features the pins (and the precision and cluster) need of a runtime."""
    out, zero, tp, pp = [], pins.zero, pins.tp or 1, pins.pp or 1
    if zero is not None:
        out.append(Feature(f"ZeRO-{zero}", f"--zero {zero}", lambda c: zero in c.zero_stages,
                           key=f"zero{zero}"))
        if pp > 1:
            out.append(Feature(f"ZeRO-{zero} with pipeline parallelism", f"--zero {zero} --pp {pp}",
                               lambda c: zero in c.pipeline_zero_stages))
        if zero == 3 and tp > 1:
            out.append(Feature("ZeRO-3 with tensor parallelism", f"--zero 3 --tp {tp}",
                               lambda c: c.zero3_with_tp))
    if pins.offload not in (None, Offload.NONE):
        kind = pins.offload
        out.append(Feature(f"{kind.value} offload", f"--offload {kind.value}",
                           lambda c: kind in c.offloads))
    if (pins.vpp or 1) > 1:
        out.append(Feature("interleaved pipeline schedule", f"--vpp {pins.vpp}",
                           lambda c: c.interleaving))
    if pins.placement is not None and pins.placement != DEFAULT_PLACEMENT:
        placement = pins.placement
        out.append(Feature(f"rank order {placement}", f"--placement {placement}",
                           lambda c: placement in c.placements))
    if (pins.cp or 1) > 1:
        out.append(Feature("ring-attention context parallelism", f"--cp {pins.cp}",
                           lambda c: c.context_parallel))
    if (pins.ep or 1) > 1:
        out.append(Feature("expert parallelism", f"--ep {pins.ep}", lambda c: c.expert_parallel))
        if tp > 1:
            out.append(Feature("expert parallelism with TP", f"--ep {pins.ep} --tp {tp}",
                               lambda c: c.expert_parallel and c.expert_parallel_with_tp))
    if pins.sp:
        out.append(Feature("Megatron-style sequence parallelism", "--sp",
                           lambda c: c.sequence_parallel))
    if pins.recompute_num_layers is not None:
        out.append(Feature("recompute of the first N blocks of each chunk",
                           f"--recompute-num-layers {pins.recompute_num_layers}",
                           lambda c: c.partial_recompute))
    out.append(Feature(f"{precision} training", f"--precision {precision}",
                       lambda c: precision in c.precisions))
    if node_groups:
        out.append(Feature("pipeline stages on node groups", "a cluster of node groups",
                           lambda c: c.node_groups))
    return out


def missing(runtime: Runtime, features: list[Feature]) -> list[Feature]:
    """The features ``runtime`` lacks."""
    return [f for f in features if not f.has(RUNTIMES[runtime])]


def names(runtimes) -> str:
    """``DeepSpeed and FSDP``: display names joined for a sentence."""
    shown = [RUNTIMES[r].name for r in runtimes]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def lack_reason(runtime: Runtime, lacking: list[Feature]) -> str:
    """``--vpp 2 --runtime deepspeed: DeepSpeed has no interleaved pipeline schedule; Megatron-LM
    and FSDP do``: what ``runtime`` lacks for which options (in its table's ``notes`` where
    they say why), and which runtimes have each."""
    parts = []
    caps = RUNTIMES[runtime]
    for feature in lacking:
        others = [r for r in Runtime if r is not runtime and feature.has(RUNTIMES[r])]
        have = (f"{names(others)} {'does' if len(others) == 1 else 'do'}" if others
                else "no runtime does")
        why = caps.notes.get(feature.key) or f"{caps.name} has no {feature.label}"
        parts.append(f"{feature.flags} --runtime {runtime.value}: {why}; {have}")
    return "; ".join(parts)


EXPORTER_GROUP = "autoplan.exporters"
"""The entry-point group export targets register under (autoplan's own in pyproject.toml)."""
BUILTIN_TARGETS = ("megatron", "deepspeed", "torchtitan", "accelerate", "colossalai", "torchrun",
                   "torchtune")
"""The targets autoplan ships, used when it runs from a source tree without installed metadata."""


def target_names() -> list[str]:
    """The export targets' names, without importing them (the CLI's choices): the entry points
    of ``autoplan.exporters``, else the built-ins."""
    return sorted({ep.name for ep in entry_points(group=EXPORTER_GROUP)} or BUILTIN_TARGETS)
