"""Measured runs for ``autoplan calibrate --runs``: a runs.csv, or training logs.

runs.csv has exactly this header, one row per measured run::

    model,cluster,seq_len,global_batch,tp,pp,dp,cp,mbs,zero,recompute,sp,runtime,tokens_per_s_per_gpu,peak_memory_gib

``model`` and ``cluster`` are paths relative to the CSV; ``peak_memory_gib`` (the allocator's
reserved peak on the most loaded GPU) may be blank. A training log (Megatron-LM or torchtitan,
plugins/training_logs.py) is read together with the configuration that produced it, found next
to it, and the model and cluster given on the command line.

Every mistake is an :class:`RunsError` (exit 2) naming the file, the row and the column.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autoplan.degrees import DEGREE
from autoplan.errors import AutoplanError

HEADER = ("model", "cluster", "seq_len", "global_batch", "tp", "pp", "dp", "cp", "mbs", "zero",
          "recompute", "sp", "runtime", "tokens_per_s_per_gpu", "peak_memory_gib")
"""The runs.csv header, in this order (the issue's contract)."""


class RunsError(AutoplanError):
    """A runs.csv or training log that cannot be used for calibration."""

    exit_code = 2


class RunRow(BaseModel):
    """One row of runs.csv, validated."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str = Field(min_length=1)
    cluster: str = Field(min_length=1)
    seq_len: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    cp: int = Field(ge=1)
    mbs: int = Field(ge=1)
    zero: int = Field(ge=0, le=3)
    recompute: Literal["none", "selective", "full"]
    sp: bool
    runtime: Literal["megatron", "deepspeed", "fsdp"]
    tokens_per_s_per_gpu: float = Field(gt=0, allow_inf_nan=False)
    peak_memory_gib: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("peak_memory_gib", mode="before")
    @classmethod
    def _blank_is_none(cls, value):
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("sp", mode="before")
    @classmethod
    def _true_or_false(cls, value):
        if isinstance(value, str) and value.strip().lower() not in ("true", "false"):
            raise ValueError("sp must be true or false")
        return value


@dataclass(frozen=True)
class MeasuredRun:
    """A run to calibrate on: where it came from, what ran, and what was measured."""

    label: str
    """``runs.csv row 3`` or the log's path: how messages and reports name the run."""
    model: Path
    cluster: Path
    seq_len: int
    global_batch: int
    pins: dict
    runtime: str
    tokens_per_s_per_gpu: float | None
    """Measured throughput; None when it comes from a step time (``step_time_s``)."""
    peak_memory_gib: float | None = None
    step_time_s: float | None = None
    """A log's step time; the throughput per GPU follows from the plan's GPU count."""
    precision: str | None = None


def _row_error(path: Path, line: int, err: ValidationError) -> RunsError:
    item = err.errors()[0]
    column = ".".join(str(p) for p in item["loc"]) or "?"
    value = item.get("input")
    return RunsError(
        f"{path} row {line}, column {column}: {item['msg']} (got {value!r}). Fix that cell; "
        f"columns are {','.join(HEADER)}.")


def _check_header(path: Path, header: list[str] | None) -> None:
    if header is None:
        raise RunsError(f"{path}: empty; the first line must be the header {','.join(HEADER)}.")
    names = [h.strip() for h in header]
    missing = [h for h in HEADER if h not in names]
    unknown = [h for h in names if h not in HEADER]
    if missing or unknown:
        parts = ([f"missing column(s) {', '.join(missing)}"] if missing else []) + \
                ([f"unknown column(s) {', '.join(unknown)}"] if unknown else [])
        raise RunsError(f"{path} row 1 (header): {'; '.join(parts)}. The header must be exactly "
                        f"{','.join(HEADER)}.")
    if tuple(names) != HEADER:
        raise RunsError(f"{path} row 1 (header): the columns are repeated or in another order "
                        f"({','.join(names)}); the header must be exactly {','.join(HEADER)}.")


def _measured_run(path: Path, line: int, row: RunRow) -> MeasuredRun:
    folder = path.parent
    for column in ("model", "cluster"):
        target = folder / getattr(row, column)
        if not target.is_file():
            raise RunsError(f"{path} row {line}, column {column}: no such file {str(target)!r} "
                            "(paths are relative to the CSV).")
    pins = {name: getattr(row, name) for name in DEGREE if name in RunRow.model_fields}
    return MeasuredRun(label=f"{path.name} row {line}", model=folder / row.model,
                       cluster=folder / row.cluster, seq_len=row.seq_len,
                       global_batch=row.global_batch, pins=pins, runtime=row.runtime,
                       tokens_per_s_per_gpu=row.tokens_per_s_per_gpu,
                       peak_memory_gib=row.peak_memory_gib)


def read_runs_csv(path: str | Path) -> list[MeasuredRun]:
    """The runs of a runs.csv; rows are numbered as the file's lines (the header is row 1)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise RunsError(f"{path}: cannot be read ({err.strerror}).") from None
    reader = csv.DictReader(text.splitlines())
    _check_header(path, reader.fieldnames)
    runs = []
    for line, cells in enumerate(reader, start=2):
        if None in cells or any(v is None for v in cells.values()):
            count = sum(v is not None for k, v in cells.items() if k is not None) + len(
                cells.get(None) or [])
            raise RunsError(f"{path} row {line}: {count} cells, but the header has "
                            f"{len(HEADER)} columns; give every column a cell (leave "
                            "peak_memory_gib blank when not measured).")
        try:
            row = RunRow.model_validate({k.strip(): v.strip() for k, v in cells.items()})
        except ValidationError as err:
            raise _row_error(path, line, err) from None
        runs.append(_measured_run(path, line, row))
    if not runs:
        raise RunsError(f"{path}: no runs below the header; add one row per measured run.")
    return runs


CONFIG_SUFFIXES = (".sh", ".args", ".txt", ".json", ".toml")
"""Where the configuration of ``train.log`` is looked for: ``train.sh``, ``train.args``, ..."""


def _config_next_to(log: Path) -> Path:
    found = [log.with_suffix(s) for s in CONFIG_SUFFIXES if log.with_suffix(s).is_file()]
    if len(found) != 1:
        names = ", ".join(log.with_suffix(s).name for s in CONFIG_SUFFIXES)
        raise RunsError(
            f"{log}: {'no' if not found else 'more than one'} configuration next to it; put "
            f"exactly one of {names} (the Megatron-LM arguments, ds_config.json or torchtitan "
            "overrides that produced the log) beside it.")
    return found[0]


def read_log_run(log: str | Path, *, model: str | Path | None,
                 cluster: str | Path | None) -> MeasuredRun:
    """A run from a training log and the configuration beside it (``--from``'s importers)."""
    from autoplan.errors import PlanFileError
    from autoplan.plugins.importers import read_run
    from autoplan.plugins.training_logs import read_training_log

    log = Path(log)
    if model is None or cluster is None:
        raise RunsError(f"{log}: a training log needs --model MODEL.py and --cluster "
                        "CLUSTER.yaml (a runs.csv names its own).")
    config = _config_next_to(log)
    try:
        logged, imported = read_training_log(log), read_run(config)
    except PlanFileError as err:
        raise RunsError(str(err)) from None
    seq_len = imported.seq_len
    batch = logged.global_batch or imported.global_batch
    if not seq_len or not batch:
        raise RunsError(f"{config}: states no sequence length or global batch "
                        "(--seq-length/--global-batch-size, training.seq_len/"
                        "training.global_batch_size); add them.")
    return MeasuredRun(label=str(log), model=Path(model), cluster=Path(cluster), seq_len=seq_len,
                       global_batch=batch, pins=dict(imported.pins), runtime=imported.runtime,
                       tokens_per_s_per_gpu=logged.tokens_per_s_per_gpu,
                       peak_memory_gib=logged.peak_memory_gib, step_time_s=logged.step_time_s,
                       precision=imported.precision)


def read_runs(source: str | Path, *, model=None, cluster=None) -> list[MeasuredRun]:
    """The runs of a runs.csv (by its ``.csv`` suffix) or of one training log."""
    source = Path(source)
    if not source.is_file():
        raise RunsError(f"--runs {source}: no such file; give a runs.csv or a training log.")
    if source.suffix.lower() == ".csv":
        return read_runs_csv(source)
    return [read_log_run(source, model=model, cluster=cluster)]
