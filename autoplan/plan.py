"""The answer autoplan gives: a Plan, its Estimate, and how the solver got there.

These are the JSON contracts of ``solve --json`` and ``estimate --json``; field names are fixed.
"""

from __future__ import annotations

import operator
from enum import Enum
from functools import cached_property
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


_FIRST_AND_COUNT = operator.attrgetter("first_layer", "num_layers")
"""A stage's ``(first_layer, num_layers)``, in C: a deep pipeline's plans list a hundred."""


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"  # attention core only
    FULL = "full"  # every layer keeps only its input


class Offload(str, Enum):
    """What lives in CPU memory instead of GPU memory (ZeRO-Offload)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    PARAMS = "params"  # optimizer state and parameters (ZeRO-3 offload)


class PipelineSchedule(str, Enum):
    """A pipeline schedule other than the default (1F1B, or Megatron's interleaved 1F1B when
    vpp > 1). ZERO_BUBBLE: backward split into input-gradient (B) and deferred weight-gradient
    (W) passes that fill the bubble (Qi et al. 2023, arXiv 2401.10241), interleaved over the
    vpp chunks (torch.distributed.pipelining ScheduleInterleavedZeroBubble)."""

    ZERO_BUBBLE = "zero_bubble"


PLACEMENT_AXES = ("tp", "cp", "dp", "pp")


class OmitsDefaults(BaseModel):
    """Optional fields added after the JSON contract was fixed (``_omitted_defaults``: name ->
    default) stay out of the JSON while they hold their default, so the documents of plans
    that do not use them are byte-identical to before."""

    _omitted_defaults: ClassVar[dict[str, object]] = {}

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler):
        data = handler(self)
        if isinstance(data, dict):
            for name, default in self._omitted_defaults.items():
                if name in data and data[name] == default:
                    del data[name]
        return data


class Stage(OmitsDefaults):
    """A pipeline stage: a contiguous run of layers of the LayerGraph chain (embedding and head
    count as layers, so ``first_layer`` indexes ``LayerGraph.layers``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    first_layer: int = Field(ge=0)
    num_layers: int = Field(ge=1)
    group: str | None = None
    """On a heterogeneous cluster: the node group (cluster.yaml ``groups[].name``) whose GPUs run
    this stage; None on a cluster of one kind of node (and then left out of the JSON)."""

    _omitted_defaults: ClassVar[dict[str, object]] = {"group": None}


class Plan(OmitsDefaults):
    """A complete parallelization of one training step.

    ``placement`` orders the mesh axes innermost first: with ``tp-cp-dp-pp`` the ranks of a TP
    group are consecutive (inside a node), the pipeline axis is outermost (Megatron's order).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    cp: int = Field(default=1, ge=1)
    zero_stage: int = Field(default=0, ge=0, le=3)
    micro_batch_size: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    recompute: Recompute = Recompute.NONE
    recompute_num_layers: int | None = Field(default=None, ge=1)
    """With full recompute: only the first N blocks of each model chunk are recomputed, the
    rest keep their activations (Megatron's ``--recompute-method block``); None: every block."""
    sequence_parallel: bool = False
    vpp: int = Field(default=1, ge=1)
    offload: Offload = Offload.NONE
    world_size: int = Field(ge=1)
    placement: str = "tp-cp-dp-pp"
    stages: tuple[Stage, ...]
    pipeline_schedule: PipelineSchedule | None = None
    """None: 1F1B (interleaved when vpp > 1). Left out of the JSON when None, so plans without
    it read and print as before."""
    ep: int = Field(default=1, ge=1)
    """Expert parallelism (Megatron-core semantics): each MoE layer's experts are split over
    ``ep`` ranks carved out of the dp*cp replicas (it does not multiply the world size); each
    GPU holds num_experts/ep experts. Left out of the JSON when 1."""

    _omitted_defaults: ClassVar[dict[str, object]] = {"pipeline_schedule": None, "ep": 1}

    @model_validator(mode="after")
    def _consistent(self) -> "Plan":
        if self.tp * self.pp * self.dp * self.cp != self.world_size:
            raise ValueError(
                f"tp*pp*dp*cp = {self.tp * self.pp * self.dp * self.cp} != world_size "
                f"{self.world_size}"
            )
        if self.micro_batch_size * self.num_microbatches * self.dp != self.global_batch_size:
            raise ValueError(
                f"micro_batch_size*num_microbatches*dp = "
                f"{self.micro_batch_size * self.num_microbatches * self.dp} != global_batch_size "
                f"{self.global_batch_size}"
            )
        if len(self.stages) != self.pp * self.vpp:
            raise ValueError(f"{len(self.stages)} stages listed, expected pp*vpp = {self.pp * self.vpp}")
        position = 0
        for stage in self.stages:
            if stage.first_layer != position:
                raise ValueError(f"stages must be contiguous from layer 0: a stage starts at "
                                 f"{stage.first_layer}, expected {position}")
            position += stage.num_layers
        grouped = {stage.group is None for stage in self.stages}
        if len(grouped) > 1:
            raise ValueError("either every stage names its node group or none does")
        if False in grouped and self.vpp > 1:
            raise ValueError("stages on node groups need vpp = 1 (one chunk per pipeline rank)")
        if self.recompute_num_layers is not None and self.recompute is not Recompute.FULL:
            raise ValueError(f"recompute_num_layers = {self.recompute_num_layers} needs "
                             f"recompute = full, not {self.recompute.value}")
        if self.pipeline_schedule is PipelineSchedule.ZERO_BUBBLE and self.vpp < 2:
            raise ValueError("pipeline_schedule zero_bubble interleaves model chunks: it needs "
                             f"vpp >= 2, not {self.vpp}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep = {self.ep} must divide dp*cp = {self.dp * self.cp}: expert "
                             "parallel ranks are carved out of the data-parallel replicas")
        if sorted(self.placement.split("-")) != sorted(PLACEMENT_AXES):
            raise ValueError(f"placement {self.placement!r} must order the axes "
                             f"{'-'.join(PLACEMENT_AXES)}, innermost first")
        return self

    @property
    def num_layers(self) -> int:
        """Layers of the chain the stages cover."""
        return sum(stage.num_layers for stage in self.stages)

    @cached_property
    def layout(self) -> tuple[tuple[int, int], ...]:
        """The stages as plain ``(first_layer, num_layers)`` pairs (a cheap, hashable key)."""
        return tuple(map(_FIRST_AND_COUNT, self.stages))

    @cached_property
    def identity(self) -> tuple:
        """Every field's value, the stages as their layout and node groups: what a plan hashes
        and compares by, worked out once. The search keys its memos by plans thousands of
        times, and pydantic's own hash walks every stage record each time."""
        fields = tuple(self.__dict__[name] for name in type(self).model_fields
                       if name != "stages")
        return fields + (self.layout, self.stage_groups)

    @cached_property
    def _hash(self) -> int:
        return hash(self.identity)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):  # pydantic's comparison for anything else
            return super().__eq__(other)
        return self is other or self.identity == other.identity

    def model_copy(self, *, update=None, deep: bool = False) -> "Plan":
        """pydantic's copy, less the values worked out from the fields (``layout``,
        ``identity``), which an ``update`` would leave stale."""
        copied = super().model_copy(update=update, deep=deep)
        for name in _DERIVED:
            copied.__dict__.pop(name, None)
        return copied

    @property
    def stage_groups(self) -> tuple[str, ...] | None:
        """The node group of each pipeline stage on a heterogeneous cluster, else None."""
        if self.stages[0].group is None:
            return None
        return tuple(stage.group for stage in self.stages)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per step per data-parallel rank (DeepSpeed's name for it)."""
        return self.num_microbatches


_DERIVED = ("layout", "identity", "_hash")
"""Plan's cached properties: kept in the instance's ``__dict__`` beside the fields."""


def degrees(plan: Plan) -> str:
    """The parallel degrees, e.g. ``TP8 x PP16 x DP64 x CP2 x EP8``: TP, PP and DP always,
    CP and EP when not 1 (EP is carved out of DP x CP, so it does not multiply the GPUs)."""
    parts = [f"TP{plan.tp}", f"PP{plan.pp}", f"DP{plan.dp}"]
    parts += [f"{name}{value}" for name, value in (("CP", plan.cp), ("EP", plan.ep)) if value > 1]
    return " x ".join(parts)


def one_line(plan: Plan) -> str:
    """The plan in one line, naming every degree that is not 1 and every memory switch, e.g.
    ``TP8 x PP16 x DP64 x CP2, VPP2, mbs 1, ZeRO-1, selective recompute, SP``: the one wording
    of a plan in reports, tables, messages and launch files."""
    parts = [degrees(plan)]
    if plan.vpp > 1:
        parts.append(f"VPP{plan.vpp}")
    parts += [f"mbs {plan.micro_batch_size}", f"ZeRO-{plan.zero_stage}"]
    if plan.recompute_num_layers is not None:
        parts.append(f"full recompute of {plan.recompute_num_layers} blocks per chunk")
    else:
        parts.append("no recompute" if plan.recompute is Recompute.NONE
                     else f"{plan.recompute.value} recompute")
    if plan.sequence_parallel:
        parts.append("SP")
    if plan.offload is not Offload.NONE:
        parts.append(f"offload {plan.offload.value}")
    if plan.placement != "-".join(PLACEMENT_AXES):  # not Megatron's default order
        parts.append(f"placement {plan.placement}")
    return ", ".join(parts)


class Estimate(OmitsDefaults):
    """Predicted step time and memory of a plan (memory is the worst GPU's: on a heterogeneous
    cluster the stage tightest against its own group's limit, which ``memory_limit_gib`` then
    is; ``stage_memory_limit_gib`` lists every stage's limit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    """What the fullest GPU needs at its peak: the caching allocator's reserved peak plus the
    memory outside it (CUDA context, NCCL buffers); "fits" is decided on it."""
    memory_limit_gib: float
    memory_breakdown_gib: dict[str, float]
    time_breakdown_s: dict[str, float]
    stage_memory_gib: tuple[float, ...]
    feasible: bool
    peak_allocated_gib: float | None = None
    """What tensors occupy on that GPU at its peak (``torch.cuda.max_memory_allocated``)."""
    peak_reserved_gib: float | None = None
    """The caching allocator's reserved peak on that GPU (``torch.cuda.max_memory_reserved``):
    allocated memory plus the allocator's slack (None in files written before it existed)."""
    stage_memory_limit_gib: tuple[float, ...] | None = None
    """Each stage's own limit when stages run on node groups with different limits (else left
    out of the JSON: ``memory_limit_gib`` holds for every stage)."""

    _omitted_defaults: ClassVar[dict[str, object]] = {"stage_memory_limit_gib": None}


class SolverInfo(BaseModel):
    """How the plan was found: the CP-SAT status name, objective and proven bound (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    status: str
    objective: float
    bound: float
    gap: float
    wall_time_s: float
    objective_terms: tuple[str, ...] = ("time",)
    """What was minimized, lexicographically; ``objective`` and ``bound`` are the first term."""
    objective_unit: str = "s"
    """s (step time), s/Mtoken (time per token when the global batch varied), $/Mtoken, GPUs."""


class ShapeRunnerUp(BaseModel):
    """The best plan of another (TP, PP) shape under the same requirements."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tp: int
    pp: int
    dp: int
    step_time_s: float
    slower_by: float  # its time per token / the chosen plan's - 1 (step time for one batch)
    plan: str | None = None  # its one-line description (one_line); None in older plan JSON


class LoraInfo(BaseModel):
    """A PEFT LoRA model's adapters (``peft_config``): rank, alpha, dropout and the Linears
    (last name component, e.g. ``q_proj``) that carry them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]


class ModelInfo(OmitsDefaults):
    """What exporters need to know of the traced model, carried in the plan JSON so that
    ``autoplan export PLAN_JSON`` needs no model.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    num_params: int
    num_trainable_params: int | None = None
    """Parameters with requires_grad (None in plan files written before it was recorded)."""
    layer_kinds: tuple[str, ...]  # kind of each LayerGraph layer, indexed like Stage.first_layer
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int | None = None
    seq_len: int
    gated_mlp: bool = False
    rmsnorm: bool = False
    rotary: bool = False
    tied_embeddings: bool = False
    linear_bias: bool = True
    num_experts: int | None = None
    """Experts per MoE layer (Megatron's --num-experts); None for a dense model, and then left
    out of the JSON like ``moe_top_k``."""
    moe_top_k: int | None = None
    rope_theta: float | None = None
    """Rotary base (Llama 3: 500000), when the model states it; exported as --rotary-base."""
    rope_scaling_type: str | None = None  # e.g. "llama3"; None: no scaling
    rope_scaling_factor: float | None = None
    norm_eps: float | None = None  # epsilon of the norms (--norm-epsilon)
    lora: LoraInfo | None = None
    """A PEFT LoRA model's adapters (torchtune's lora_rank, lora_alpha, target modules); None,
    and left out of the JSON, for other models."""

    _omitted_defaults: ClassVar[dict[str, object]] = {
        "num_experts": None, "moe_top_k": None, "rope_theta": None, "rope_scaling_type": None,
        "rope_scaling_factor": None, "norm_eps": None, "lora": None}


class TrainingInfo(OmitsDefaults):
    """The training settings the plan was made for."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    seq_len: int
    global_batch: int
    precision: str
    runtime: str
    optimizer: str = "adamw"
    frozen_dtype: str | None = None
    """How frozen Linear weights are stored (bf16, fp16, int8, nf4); None in older files."""
    optimizer_in_backward: bool = False
    """The optimizer steps each parameter in backward (TrainingSpec.optimizer_in_backward);
    left out of the JSON when false."""
    torch_compile: bool = False
    """The runtime compiles its blocks (``runtime_settings={"compile": True}`` on the fsdp
    runtime), as the plan was priced: torchtitan's export turns on ``--compile.enable`` for the
    model; left out of the JSON when false."""
    transformer_impl: str | None = None
    """The block implementation whose fused kernels the plan was priced with (the runtime's
    ``transformer_impl``: ``transformer_engine`` or ``local``), exported to Megatron-LM as
    ``--transformer-impl``; left out of the JSON when None (eager kernels)."""

    grad_reduce_in_bf16: bool = False
    """The plan was priced with bf16 gradients reduced in bf16 (the megatron runtime's
    ``grad_reduce_in_bf16``, bf16 or FP8 training), exported to Megatron-LM as
    ``--grad-reduce-in-bf16``; left out of the JSON when false."""
    tp_comm_overlap: bool = False
    """The plan was priced with Transformer Engine's userbuffers TP overlap (the runtime's
    ``tp_comm_overlap``, with SP and TP inside a node: costmodels.tp_overlap), exported to
    Megatron-LM as ``--tp-comm-overlap``; left out of the JSON when false."""
    tp_comm_overlap_cfg: dict[str, dict[str, int]] | None = None
    """The per-op userbuffers settings it was priced with where not TE's defaults (the
    runtime's ``tp_comm_overlap_cfg``: op -> num_sm, set_sm_margin, num_splits, aggregate);
    left out of the JSON when None."""

    _omitted_defaults: ClassVar[dict[str, object]] = {"optimizer_in_backward": False,
                                                      "torch_compile": False,
                                                      "transformer_impl": None,
                                                      "grad_reduce_in_bf16": False,
                                                      "tp_comm_overlap": False,
                                                      "tp_comm_overlap_cfg": None}


class RuntimeOption(BaseModel):
    """The best plan one runtime (framework) offers for the same question, or why it has none
    (``status`` UNSUPPORTED: it lacks what the pins ask; INFEASIBLE: nothing fits;
    NO_PLAN_IN_TIME; else the solver's status of its search)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    runtime: str
    status: str
    step_time_s: float | None
    peak_memory_gib: float | None
    plan: Plan | None
    reason: str | None


class ZeroOption(BaseModel):
    """The best plan of one runtime at one ZeRO stage (its ZeRO-2 and ZeRO-3 side by side)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    runtime: str
    zero_stage: int
    step_time_s: float
    peak_memory_gib: float
    plan: Plan


class CalibrationNote(BaseModel):
    """The ``--profile`` of ``calibrate --runs`` a result was costed with: the parameters it
    set and why they may not hold here (another GPU or runtime, far outside its scale)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    profile: str
    parameters: dict[str, float]
    warnings: list[str] = []


class Result(OmitsDefaults):
    """What ``autoplan.solve`` returns; ``model_dump()`` is the CLI's ``--json`` document.

    ``model``, ``cluster`` (the cluster.yaml mapping as validated) and ``training`` make the
    document self-contained for ``autoplan export`` and ``autoplan explain``. ``runtimes``: each
    runtime considered by ``solve``, best plan or reason (left out of estimates); ``zero_options``
    the best ZeRO-2 and ZeRO-3 plans of runtimes where both fit; ``estimates_by_runtime`` the
    chosen plan priced on the other runtimes that can run it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    plan: Plan
    estimate: Estimate
    solver: SolverInfo
    model: ModelInfo | None = None
    cluster: dict | None = None
    training: TrainingInfo | None = None
    runners_up: list[ShapeRunnerUp] | None = None
    runtimes: list[RuntimeOption] | None = None
    zero_options: list[ZeroOption] | None = None
    estimates_by_runtime: dict[str, Estimate] | None = None
    """The chosen plan priced on every other runtime that can run it: what each export target
    stamps on its files (``plugins``: DeepSpeed files carry DeepSpeed's step time)."""
    calibration: CalibrationNote | None = None
    """Set when costed with a ``calibrate --runs`` profile (left out of the JSON otherwise)."""

    _omitted_defaults: ClassVar[dict[str, object]] = {
        "runtimes": None, "zero_options": None, "estimates_by_runtime": None,
        "calibration": None}

    @property
    def status(self) -> str:
        """The CP-SAT status name: OPTIMAL, FEASIBLE or INFEASIBLE."""
        return self.solver.status
