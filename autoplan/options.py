"""The ``--options FILE`` schema of ``autoplan solve``: what to optimize and the user's
requirements beyond the few CLI flags (STYLE: few flags, the rest in a validated file).

Example::

    objective: [gpus, time]      # or one of time (default), gpus, cost
    min_tokens_per_s: 400000     # every plan must reach this throughput
    price_per_gpu_hour: 2.5      # $ for the cost objective's report
    pins: {zero: 1}
    bounds: {tp: {max: 4}, pp: {min: 2, max: 8}}
    mem_limit: 70GiB             # at most the GPU's memory
    max_gpus: 64                 # a GPU budget: plans use at most this many
    global_batch: [256, 512]     # or {min: 256, max: 1024}: the solver picks it
    tp_within_node: true
    forbid_offload: true
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autoplan.errors import ConstraintError
from autoplan.training import Bounds, ObjectiveTerm, Pins, Range


class BatchRange(BaseModel):
    """Global batches the solver may choose between: the powers of two in [min, max] and the
    two ends themselves (tokens/s, not step time, then compares plans)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "BatchRange":
        if self.min > self.max:
            raise ValueError(f"global_batch min {self.min} exceeds max {self.max}")
        return self

    def values(self) -> list[int]:
        powers = [2**k for k in range(self.max.bit_length()) if self.min <= 2**k <= self.max]
        return sorted({self.min, self.max, *powers})


class SolveOptions(BaseModel):
    """Everything ``--options`` may hold; CLI flags given on the command line win."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    objective: ObjectiveTerm | list[ObjectiveTerm] | None = None
    min_tokens_per_s: float | None = Field(default=None, gt=0)
    price_per_gpu_hour: float | None = Field(default=None, gt=0)
    pins: Pins = Pins()
    bounds: Bounds = Bounds()
    mem_limit: str | None = None
    max_gpus: int | None = Field(default=None, ge=1)
    global_batch: int | list[int] | BatchRange | None = None
    tp_within_node: bool = False
    forbid_offload: bool = False


def global_batches(value: int | list[int] | BatchRange | dict | None) -> list[int] | None:
    """The allowed global batches, ascending (the candidate order of the search)."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = BatchRange(**value)
    if isinstance(value, BatchRange):
        return value.values()
    values = [value] if isinstance(value, int) else list(value)
    if not values or any(v < 1 for v in values):
        raise ConstraintError("global_batch: give a positive integer, a list of them, or "
                              "{min: 256, max: 1024}.")
    return sorted(set(values))


def with_node_limit(bounds: Bounds, gpus_per_node: int) -> Bounds:
    """``tp_within_node``: TP at most a node's GPUs (tighter bounds win)."""
    tp = bounds.tp or Range()
    ceiling = min(tp.max or gpus_per_node, gpus_per_node)
    return bounds.model_copy(update={"tp": Range(min=tp.min, max=ceiling)})


def load_options(path: str | Path) -> SolveOptions:
    """Read and validate an options YAML; a misspelt key is an error that names it."""
    path = Path(path)
    if not path.is_file():
        raise ConstraintError(f"{path}: no such file; pass the path of a solve options YAML.")
    try:
        return SolveOptions.model_validate(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as err:
        raise ConstraintError(f"{path}: not valid YAML ({err}).") from None
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}"
                             for e in err.errors())
        raise ConstraintError(f"{path}: {problems}. Keys: {', '.join(SolveOptions.model_fields)}."
                              ) from None
