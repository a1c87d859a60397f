"""What the user asks for: the training run (TrainingSpec) and the limits on the plan (Constraints)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from autoplan.degrees import pin_fields


class Precision(str, Enum):
    """The training precision. FP8: bf16 weights, gradients and activations, with the blocks'
    Linear layers run by Transformer Engine under ``fp8_autocast`` with the hybrid format
    (E4M3 inputs and weights, E5M2 gradients) and delayed scaling, as Megatron-LM's
    ``--bf16 --fp8-format hybrid`` and llm-foundry's ``precision: amp_fp8`` run them (GPUs
    with FP8 tensor cores only: Hopper, Ada, Blackwell)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def storage(self) -> str:
        """The 16-bit dtype weights and activations are kept in: bf16 under FP8."""
        return "bf16" if self is Precision.FP8 else self.value


class Runtime(str, Enum):
    """The framework that will run the plan; memory and overlap differ between them."""

    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"


DEFAULT_TIME_LIMIT_S = 60.0
"""The search's time limit when none is given (``solve --time-limit``)."""
DEFAULT_PLACEMENT = "tp-cp-dp-pp"
PIPELINE_INSIDE_PLACEMENT = "tp-cp-pp-dp"
KNOWN_PLACEMENTS = (DEFAULT_PLACEMENT, PIPELINE_INSIDE_PLACEMENT)
"""Rank orders (innermost axis first) autoplan plans: Megatron-LM's default ``tp-cp-ep-dp-pp``
and, with ``--use-tp-pp-dp-mapping``, ``tp-cp-ep-pp-dp`` (megatron/core/parallel_state.py
``order``); which runtime builds which is in ``autoplan.capabilities``."""


class FrozenDtype(str, Enum):
    """How frozen Linear weights are stored: the training precision, LLM.int8's 8-bit, or
    QLoRA's 4-bit NormalFloat with double quantization (bitsandbytes; Dettmers et al. 2023)."""

    BF16 = "bf16"
    FP16 = "fp16"
    INT8 = "int8"
    NF4 = "nf4"


class Optimizer(str, Enum):
    """The optimizer of the trained parameters: Adam(W) with fp32 moments, bitsandbytes'
    block-wise 8-bit Adam(W), or SGD with momentum."""

    ADAMW = "adamw"
    ADAMW8BIT = "adamw8bit"
    SGD = "sgd"


class AttentionKernel(str, Enum):
    """FLASH: fused kernels that keep no s x s matrix (FlashAttention, cuDNN). EXPLICIT:
    scores materialized and a fused softmax (Megatron-LM before FlashAttention, 2021-2022)."""

    FLASH = "flash"
    EXPLICIT = "explicit"


class TrainingSpec(BaseModel):
    """One training step: sequence length, global batch (sequences), precision, runtime, the
    optimizer, whether it steps in backward, and how frozen weights are stored (None: in the
    training precision)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    seq_len: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    precision: Precision = Precision.BF16
    runtime: Runtime = Runtime.MEGATRON
    attention: AttentionKernel = AttentionKernel.FLASH
    optimizer: Optimizer = Optimizer.ADAMW
    frozen_dtype: FrozenDtype | None = None
    optimizer_in_backward: bool = False
    """Each parameter is stepped, and its gradient freed, as soon as its gradient is complete
    (torchtune's ``optimizer_in_bwd``: one optimizer per parameter, stepped from a
    ``register_post_accumulate_grad_hook``), so gradients of about one layer exist at a time;
    no gradient accumulation (one micro-batch per step)."""

    @property
    def frozen_storage(self) -> FrozenDtype:
        """The frozen weights' storage, defaulting to the training precision."""
        return self.frozen_dtype or FrozenDtype(self.precision.storage)

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


class Pins(create_model("PinFields", **pin_fields())):
    """Dimensions the user fixes, by their pin names (the fields and their meaning are
    ``autoplan.degrees.DEGREES``); None means 'search it'. ``placement`` is a rank order,
    innermost axis first (see KNOWN_PLACEMENTS); ``ep`` expert parallelism, carved out of
    dp*cp (see Plan.ep)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("placement")
    @classmethod
    def _known_placement(cls, value: str | None) -> str | None:
        known = sorted(KNOWN_PLACEMENTS)
        if value is not None and value not in known:
            raise ValueError(f"placement {value!r} is not one of {', '.join(known)}")
        return value

    def pinned(self) -> dict[str, object]:
        """The pins that are set, by name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Constraints(BaseModel):
    """Limits on the search: pins, a per-GPU memory cap and a solver time limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pins: Pins = Pins()
    mem_limit_bytes: float | None = Field(default=None, gt=0)
    time_limit_s: float = Field(default=60.0, gt=0)
    bounds: "Bounds" = Field(default_factory=lambda: Bounds())
    max_gpus: int | None = Field(default=None, ge=1)
    objective: "Objective" = Field(default_factory=lambda: Objective())


class ObjectiveTerm(str, Enum):
    """What the solver minimizes. TIME: step time (time per token when the global batch may
    vary). GPUS: GPUs used. COST: GPU-seconds per token (times the hourly price)."""

    TIME = "time"
    GPUS = "gpus"
    COST = "cost"


class Objective(BaseModel):
    """Terms minimized lexicographically (``("gpus", "time")``: fewest GPUs, then fastest),
    a throughput every plan must reach, and the price that turns GPU-seconds into dollars."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    terms: tuple[ObjectiveTerm, ...] = (ObjectiveTerm.TIME,)
    min_tokens_per_s: float | None = Field(default=None, gt=0)
    price_per_gpu_hour: float = Field(default=2.0, gt=0)

    @property
    def primary(self) -> ObjectiveTerm:
        return self.terms[0]

    @property
    def needs_every_dp(self) -> bool:
        """Fewer GPUs can win under GPUS or COST, so the 'largest DP degrees' dominance of the
        time search no longer holds."""
        return any(t is not ObjectiveTerm.TIME for t in self.terms)


class Range(BaseModel):
    """Inclusive bounds on one degree; None: unbounded on that side."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1)

    def admits(self, value: int) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class Bounds(BaseModel):
    """``min``/``max`` on the plan's integer degrees."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tp: Range | None = None
    pp: Range | None = None
    dp: Range | None = None
    mbs: Range | None = None
    vpp: Range | None = None
    cp: Range | None = None
    ep: Range | None = None

    def admits(self, **degrees: int) -> bool:
        return all(r is None or r.admits(degrees[name]) for name, r in self.set().items())

    def set(self) -> dict[str, Range]:
        return {k: getattr(self, k) for k in type(self).model_fields if getattr(self, k) is not None}

    def labels(self) -> dict[str, str]:
        """One readable requirement per set side, e.g. ``{"tp.max": "tp <= 4"}``."""
        out = {}
        for name, r in self.set().items():
            if r.min is not None:
                out[f"{name}.min"] = f"{name} >= {r.min}"
            if r.max is not None:
                out[f"{name}.max"] = f"{name} <= {r.max}"
        return out


Constraints.model_rebuild()
