"""The ``--options FILE`` schema of ``autoplan solve``: what to optimize and the user's
requirements beyond the few CLI flags (STYLE: few flags, the rest in a validated file).

Example::

    objective: [gpus, time]      # or one of time (default), gpus, cost
    min_tokens_per_s: 400000     # every plan must reach this throughput
    price_per_gpu_hour: 2.5      # $ for the cost objective's report
    pins: {zero: 1}
    bounds: {tp: {max: 4}, pp: {min: 2, max: 8}}
    mem_limit: 70GiB             # may only lower the GPU's memory
    headroom: 0.05               # fraction of it plans leave free (the default)
    max_gpus: 64                 # a GPU budget: plans use at most this many
    global_batch: [256, 512]     # or {min: 256, max: 1024}: the solver picks it
    tp_within_node: true
    forbid_offload: true
    optimizer: adamw8bit         # adamw (default), adamw8bit or sgd
    frozen_dtype: nf4            # frozen Linear weights: bf16, fp16, int8, nf4 (QLoRA)
    optimizer_in_backward: true  # step each parameter in backward (FSDP; no accumulation)
    trace_timeout: 300           # seconds model.py may take to import and trace (default 120)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autoplan.cluster.spec import Cluster
from autoplan.errors import ConstraintError
from autoplan.plan import Offload
from autoplan.training import (
    Bounds, Constraints, FrozenDtype, Objective, ObjectiveTerm, Optimizer, Pins, Range,
)
from autoplan.units import parse_quantity


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
    headroom: float | None = None
    max_gpus: int | None = Field(default=None, ge=1)
    global_batch: int | list[int] | BatchRange | None = None
    tp_within_node: bool = False
    forbid_offload: bool = False
    optimizer: Optimizer | None = None
    frozen_dtype: FrozenDtype | None = None
    optimizer_in_backward: bool = False
    trace_timeout: float | None = Field(default=None, gt=0)


def global_batches(value: int | list[int] | BatchRange | dict | None) -> list[int] | None:
    """The allowed global batches, ascending (the candidate order of the search)."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = validated(BatchRange, value, "global_batch")
    if isinstance(value, BatchRange):
        return value.values()
    listed = isinstance(value, (list, tuple))
    values = [value] if isinstance(value, int) else list(value) if listed else []
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
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
        raise ConstraintError(f"{path}: {field_problems(err)}. Keys: "
                              f"{', '.join(SolveOptions.model_fields)}.") from None


def as_options(options: SolveOptions | dict | str | Path | None) -> SolveOptions:
    """Options from an object, a mapping or the path of a YAML file."""
    if options is None:
        return SolveOptions()
    if isinstance(options, SolveOptions):
        return options
    if isinstance(options, dict):
        return validated(SolveOptions, options, "options")
    if not isinstance(options, (str, Path)):
        raise ConstraintError(f"options: expected a SolveOptions, a mapping or the path of an "
                              f"options YAML; got {type(options).__name__}.")
    return load_options(options)


def options_mem_limit(opts: SolveOptions, cluster: Cluster) -> float | None:
    """The file's ``mem_limit`` in bytes, which may only lower the GPU's memory."""
    if opts.mem_limit is None:
        return None
    return mem_limit_bytes(opts.mem_limit, cluster, field="mem_limit")


def mem_limit_bytes(value: str | float | None, cluster: Cluster, *, field: str = "--mem-limit"
                    ) -> float:
    """A per-GPU memory cap in bytes (a quantity like ``72GiB`` or bytes), else the largest
    GPU's memory. One rule for the command line and the options file: a cap may only lower the
    GPU's memory (memory beyond it does not exist, so plans "fitting" there would not run).

    Raises:
        ConstraintError: the cap exceeds the GPU's memory.
    """
    gpu_bytes = max(g.gpu.memory_bytes for g in cluster.groups or (cluster,))
    if value is None:
        return float(gpu_bytes)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        limit = float(value)
    else:
        limit = parse_quantity(value, "memory", field=field)
    if limit > gpu_bytes * (1 + 1e-9):  # a limit read back from a plan JSON rounds
        name = cluster.gpu.name if cluster.is_homogeneous else "largest GPU"
        raise ConstraintError(
            f"{field} {value if isinstance(value, str) else f'{limit / 2**30:.1f}GiB'} exceeds "
            f"the {name}'s {gpu_bytes / 2**30:.1f} GiB; it can only lower the limit. Give at "
            f"most {gpu_bytes / 2**30:.1f}GiB or leave {field} unset.")
    return limit


DEFAULT_HEADROOM = 0.05
"""Fraction of GPU memory ``solve`` leaves free by default. What it covers: the spread of the
caching allocator's reserved peak between steps and runs of one configuration (fragmentation
depends on the order of frees; the Llama 3.1 rows of torchtitan's performance.md differ by up
to 0.6 GiB of 84 across CP degrees that hold the same bytes), memory the model does not see
(a data loader's pinned buffers, a profiler, NCCL growing its buffers for a new
communicator), and the cost model's own error on the measured rows
(benchmarks/memory_accuracy.py). 5% of an 80 GiB GPU is 4 GiB."""


def solve_headroom(headroom: float | None, opts: SolveOptions) -> float:
    """The caller's headroom, else the options file's, else the default; checked."""
    value = headroom if headroom is not None else opts.headroom
    value = DEFAULT_HEADROOM if value is None else value
    if not 0 <= value < 1:
        raise ConstraintError(
            f"headroom {value}: give the fraction of GPU memory to leave free, from 0 (fill "
            "the GPU) to below 1, e.g. 0.05.")
    return float(value)


def merge_options(opts: SolveOptions, cluster: Cluster, *, pins: Pins, bounds=None,
                  max_gpus: int | None = None, objective=None,
                  min_tokens_per_s: float | None = None,
                  price_per_gpu_hour: float | None = None, tp_within_node: bool | None = None,
                  forbid_offload: bool | None = None,
                  time_limit_s: float | None = None) -> Constraints:
    """The options file with the caller's values (CLI flags, API keywords) over it."""
    merged = {**opts.pins.pinned(), **pins.pinned()}
    if forbid_offload if forbid_offload is not None else opts.forbid_offload:
        if merged.get("offload", Offload.NONE) != Offload.NONE:
            raise ConstraintError(f"forbid_offload contradicts --offload {merged['offload']}.")
        merged["offload"] = Offload.NONE
    if bounds is None:
        bounds = opts.bounds
    elif not isinstance(bounds, Bounds):
        bounds = validated(Bounds, bounds, "bounds")
    if tp_within_node if tp_within_node is not None else opts.tp_within_node:
        bounds = with_node_limit(bounds, cluster.gpus_per_node)
    terms = objective if objective is not None else opts.objective or ObjectiveTerm.TIME
    terms = [terms] if isinstance(terms, (str, ObjectiveTerm)) else list(terms)
    goal = validated(Objective, {
        "terms": [t.strip() if isinstance(t, str) else t for t in terms],
        "min_tokens_per_s": min_tokens_per_s or opts.min_tokens_per_s,
        "price_per_gpu_hour": price_per_gpu_hour or opts.price_per_gpu_hour or 2.0}, "objective")
    return validated(Constraints, {
        "pins": validated(Pins, merged, "pins"), "bounds": bounds,
        "max_gpus": max_gpus if max_gpus is not None else opts.max_gpus, "objective": goal,
        **({"time_limit_s": time_limit_s} if time_limit_s else {})}, "solve settings")


def validated(schema, values: Mapping, what: str):
    """``schema`` built from the caller's ``values``; anything wrong is one ConstraintError
    naming each bad field (the message the CLI prints)."""
    if not isinstance(values, Mapping):
        raise ConstraintError(f"{what}: expected a mapping of names to values; got "
                              f"{type(values).__name__}.")
    try:
        return schema.model_validate(dict(values))
    except ValidationError as err:
        raise ConstraintError(f"{what}: {field_problems(err)}.") from None


def field_problems(err: ValidationError) -> str:
    """``loc: message`` of each problem, without pydantic's type codes and links."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
                     for e in err.errors())


def as_pins(pins: Mapping[str, Any] | Pins | None) -> Pins:
    """Pins by the CLI's names (``{"tp": 8, "zero": 1}``), checked; None pins nothing."""
    if isinstance(pins, Pins):
        return pins
    return validated(Pins, pins or {}, "pins")
