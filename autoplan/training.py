"""What the user asks for: the training run (TrainingSpec) and the limits on the plan (Constraints)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from autoplan.plan import Offload, Recompute


class Precision(str, Enum):
    BF16 = "bf16"
    FP16 = "fp16"


class Runtime(str, Enum):
    """The framework that will run the plan; memory and overlap differ between them."""

    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"


class AttentionKernel(str, Enum):
    """FLASH: fused kernels that keep no s x s matrix (FlashAttention, cuDNN). EXPLICIT:
    scores materialized and a fused softmax (Megatron-LM before FlashAttention, 2021-2022)."""

    FLASH = "flash"
    EXPLICIT = "explicit"


class TrainingSpec(BaseModel):
    """One training step: sequence length, global batch (sequences), precision and runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    seq_len: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    precision: Precision = Precision.BF16
    runtime: Runtime = Runtime.MEGATRON
    attention: AttentionKernel = AttentionKernel.FLASH

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


class Pins(BaseModel):
    """Dimensions the user fixes, by the CLI's names; None means 'search it'."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    dp: int | None = Field(default=None, ge=1)
    cp: int | None = Field(default=None, ge=1)
    mbs: int | None = Field(default=None, ge=1)
    zero: int | None = Field(default=None, ge=0, le=3)
    recompute: Recompute | None = None
    recompute_num_layers: int | None = Field(default=None, ge=1)
    sp: bool | None = None
    vpp: int | None = Field(default=None, ge=1)
    offload: Offload | None = None

    def pinned(self) -> dict[str, object]:
        """The pins that are set, by name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Constraints(BaseModel):
    """Limits on the search: pins, a per-GPU memory cap and a solver time limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pins: Pins = Pins()
    mem_limit_bytes: float | None = Field(default=None, gt=0)
    time_limit_s: float = Field(default=60.0, gt=0)
