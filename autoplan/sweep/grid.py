"""Trade-off exploration: solve a grid of inputs in parallel, mark Pareto fronts, write tables.

A sweep is a base set of inputs (``PointInputs``) and axes (``Axes``) whose cartesian product
gives the points. Each point is an ordinary ``api.solve`` on a cluster derived from the base
cluster.yaml (``nodes``, ``gpu``, ``inter_bandwidth`` ...), so a sweep row and ``autoplan solve``
of the same inputs give the same plan. The model is traced once per (sequence length,
precision) in the parent before the worker processes fork, so they inherit the traces.

Fronts (all objectives minimized; a point is on a front when no other feasible point is at
least as good in both and better in one):

- ``time_vs_gpus``: step time and GPU count;
- ``cost_vs_time``: cost per token (GPU-hour price x GPUs x step time / tokens per step) and
  time to train ``train_tokens``;
- ``headroom_vs_speed``: memory headroom (limit - peak, maximized) and tokens/s (maximized).

``pareto`` in the JSON is membership of the first, the front of the scaling question.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from autoplan.degrees import DEGREE, SWEPT, sweep_fields
from autoplan.errors import AutoplanError, ConstraintError
from autoplan.files import replacing, write_atomically
from autoplan.plan import Plan, one_line
from autoplan.sweep.fronts import FRONTS, pareto_mask

logger = logging.getLogger(__name__)

PIN_NAMES = SWEPT
"""The pins a sweep point may set (``autoplan.degrees``)."""
DEFAULT_PRICE_PER_GPU_HOUR = 2.0
"""US dollars per GPU-hour; a placeholder near 2024 cloud A100 list prices. Pass your own."""
DEFAULT_TRAIN_TOKENS = 1e12
"""Tokens of the training run whose time-to-train the cost front uses (Llama 2: 2T)."""


class _RunInputs(BaseModel):
    """The inputs of one point other than its pins."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    nodes: int | None = Field(default=None, ge=1)
    """Nodes of the cluster (hosts are dropped when this changes)."""
    gpu: str | None = None
    """Catalog GPU name; an NVLink/NVSwitch cluster then uses that GPU's own NVLink."""
    mem_limit: str | None = None
    """Per-GPU memory cap, e.g. 72GiB."""
    inter_bandwidth: str | None = None
    """Inter-node bandwidth per NIC per direction, e.g. 100Gbps."""
    intra_bandwidth: str | None = None
    """Intra-node bandwidth per GPU per direction, e.g. 300GB/s."""
    global_batch: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    runtime: str | None = None
    precision: str | None = None

    def set_values(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class PointInputs(create_model("PointFields", __base__=_RunInputs, **sweep_fields())):
    """The inputs of one point: the run's, then the pins (``autoplan.degrees.SWEPT``); unset
    ones come from the base cluster.yaml or the defaults."""


SWEEPABLE = tuple(PointInputs.model_fields)


class _RunAxes(BaseModel):
    """The swept inputs other than pins."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    nodes: list[int] | None = None
    gpu: list[str] | None = None
    mem_limit: list[str] | None = None
    inter_bandwidth: list[str] | None = None
    intra_bandwidth: list[str] | None = None
    global_batch: list[int] | None = None
    seq_len: list[int] | None = None
    runtime: list[str] | None = None
    precision: list[str] | None = None


class Axes(create_model("AxesFields", __base__=_RunAxes, **sweep_fields(lists=True))):
    """The swept inputs, each a list of values (the run's, then the pins); the points are
    their cartesian product."""


class SweepSpec(BaseModel):
    """A sweep file (examples/sweeps/*.yaml). Paths are relative to the file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str
    cluster: str
    base: PointInputs = PointInputs()
    """Inputs held fixed (seq_len and global_batch must be given here or swept)."""
    over: Axes
    price_per_gpu_hour: float | dict[str, float] = DEFAULT_PRICE_PER_GPU_HOUR
    """$ per GPU-hour: one price, or one per catalog GPU name (for sweeps over ``gpu``)."""
    train_tokens: float = Field(default=DEFAULT_TRAIN_TOKENS, gt=0)
    time_limit_s: float = Field(default=60.0, gt=0)


def _explain_validation(err: ValidationError, origin: str) -> str:
    problems = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "file"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"unknown key; sweepable inputs are {', '.join(SWEEPABLE)}"
        problems.append(f"{where}: {message} (got {item.get('input')!r})")
    return f"{origin}: invalid sweep. " + "; ".join(problems) + "."


def load_sweep_spec(path: str | Path) -> SweepSpec:
    """Read a sweep YAML; model and cluster paths become relative to the working directory."""
    path = Path(path)
    if not path.is_file():
        raise ConstraintError(f"{path}: no such file; pass the path of a sweep YAML.")
    try:
        data = yaml.safe_load(path.read_text())
        spec = SweepSpec.model_validate(data)
    except yaml.YAMLError as err:
        raise ConstraintError(f"{path}: not valid YAML ({err}).") from None
    except ValidationError as err:
        raise ConstraintError(_explain_validation(err, str(path))) from None
    base = path.parent
    return spec.model_copy(update={"model": str(base / spec.model),
                                   "cluster": str(base / spec.cluster)})


def parse_over(items: Iterable[str]) -> Axes:
    """``["nodes=1,2,4", "gpu=h100-sxm5-80gb"]`` -> Axes (values typed by the schema)."""
    axes: dict[str, list[str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ConstraintError(f"--over {item!r}: write NAME=V1,V2,... e.g. nodes=1,2,4,8.")
        axes.setdefault(name, []).extend(v.strip() for v in values.split(",") if v.strip())
    try:
        return Axes.model_validate(axes)
    except ValidationError as err:
        raise ConstraintError(_explain_validation(err, "--over")) from None


def points(base: PointInputs, axes: Axes) -> list[PointInputs]:
    """The cartesian product of the axes over the base, axes in the schema's field order
    (nodes, gpu, mem_limit, ..., seq_len, pins), the last one varying fastest."""
    swept = {k: v for k, v in axes.model_dump().items() if v}
    names = list(swept)
    out = []
    for combo in itertools.product(*(swept[n] for n in names)):
        values = {**base.set_values(), **dict(zip(names, combo))}
        for needed in ("seq_len", "global_batch"):
            if needed not in values:
                raise ConstraintError(
                    f"{needed} is neither given nor swept; pass --{needed.replace('_', '-')} or "
                    f"sweep it (--over {needed}=...).")
        try:
            out.append(PointInputs(**values))
        except ValidationError as err:
            point = ", ".join(f"{n}={v}" for n, v in zip(names, combo))
            raise ConstraintError(_explain_validation(err, f"sweep point {point}")) from None
    return out


def point_cluster(spec: dict, inputs: PointInputs) -> dict:
    """The cluster.yaml mapping of a point: the base with the point's cluster inputs applied."""
    spec = json.loads(json.dumps(spec))  # deep copy of plain data
    if inputs.nodes is not None and inputs.nodes != spec["nodes"]:
        spec["nodes"] = inputs.nodes
        spec.pop("hosts", None)
        spec.pop("name", None)
    if inputs.gpu is not None and inputs.gpu != spec["gpu"]:
        spec["gpu"] = inputs.gpu
        spec.pop("name", None)
        if spec["intra_node"]["link"] != "pcie":
            spec["intra_node"].pop("bandwidth", None)
    if inputs.intra_bandwidth is not None:
        spec["intra_node"]["bandwidth"] = inputs.intra_bandwidth
    if inputs.inter_bandwidth is not None:
        if "inter_node" not in spec:
            raise ConstraintError(
                "inter_bandwidth is swept but the cluster has no inter_node section; add one "
                "(e.g. inter_node: {link: infiniband, nics_per_node: 8, bandwidth: 200Gbps}).")
        spec["inter_node"]["bandwidth"] = inputs.inter_bandwidth
    return spec


@dataclass(frozen=True)
class _Task:
    """One point: its inputs and its cluster mapping (plain, picklable data)."""

    index: int
    inputs: PointInputs
    cluster: dict
    time_limit_s: float
    profile: object = None
    """A loaded --profile (picklable), or None."""


def _solve_point(model, task: _Task) -> dict:
    """One ``api.solve``; an infeasible point returns its explanation instead of a plan."""
    from autoplan import api

    inputs = task.inputs
    pins = {k: getattr(inputs, k) for k in PIN_NAMES if getattr(inputs, k) is not None}
    try:
        result = api.solve(
            model, task.cluster, seq_len=inputs.seq_len, global_batch=inputs.global_batch,
            pins=pins, mem_limit=inputs.mem_limit, time_limit_s=task.time_limit_s,
            precision=inputs.precision or "bf16", runtime=inputs.runtime,
            profile=task.profile, runners_up=False,  # one plan per point (unset runtime: auto)
            processes=1)  # the points are what runs side by side
    except AutoplanError as err:
        return {"index": task.index, "plan": None, "estimate": None, "solver": None,
                "error": str(err), "exit_code": err.exit_code}
    doc = result.model_dump(mode="json")
    row = {"index": task.index, "plan": doc["plan"], "estimate": doc["estimate"],
           "solver": doc["solver"], "gpu": _gpu_name(task.cluster),
           "runtime": doc["training"]["runtime"]}
    if "calibration" in doc:
        row["calibration"] = doc["calibration"]
    return row


def _gpu_name(cluster: dict) -> str:
    gpu = cluster["gpu"]
    return gpu if isinstance(gpu, str) else gpu["name"]


def gpu_hour_price(price: float | dict[str, float], gpu: str) -> float:
    """The price of one GPU-hour of ``gpu``."""
    if not isinstance(price, dict):
        return float(price)
    if gpu not in price:
        raise ConstraintError(
            f"price_per_gpu_hour lists {', '.join(sorted(price))} but not {gpu!r}; give a price "
            "for every GPU the sweep uses.")
    return float(price[gpu])


# The model of this worker process. Workers are forked after the parent traced the model, so
# they inherit it, traces included, without pickling (model.py's functions may not pickle).
_worker_model = None


def _init_worker(model) -> None:
    global _worker_model
    _worker_model = model


def _solve_in_worker(task: _Task) -> dict:
    return _solve_point(_worker_model, task)


def run_points(model, cluster, inputs: list[PointInputs], *, time_limit_s: float = 60.0,
               workers: int | None = None, ray_address: str | None = None,
               progress: Callable[[int, int], None] | None = None,
               profile=None) -> list[dict]:
    """Solve every point (in forked worker processes when ``workers`` > 1, or as Ray tasks when
    ``ray_address`` is given); results in point order.

    Args:
        model: a loaded ``api.Model``; traced here once per (seq_len, precision) before the
            workers start, so they find the traces in its cache.
        cluster: a loaded cluster (``api.LoadedCluster``); each point derives its own from it.
        ray_address: a Ray cluster (``ray://host:10001``, ``auto``) or ``local`` to start one
            on this machine; its workers need autoplan installed.
        progress: called with (points done, points total) after each point.
    """
    from autoplan import api

    tasks = []
    for index, point in enumerate(inputs):
        mapping = point_cluster(cluster.spec, point)
        api.load_cluster(mapping)  # a bad derived cluster is the user's error: fail before solving
        model.trace(point.seq_len, point.precision or "bf16")
        tasks.append(_Task(index, point, mapping, time_limit_s, profile))
    if ray_address is not None:
        return _run_on_ray(model, tasks, ray_address, num_cpus=workers, progress=progress)
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _collect(((_solve_point(model, task) for task in tasks)), len(tasks), progress)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=_init_worker, initargs=(model,)) as pool:
        futures = [pool.submit(_solve_in_worker, task) for task in tasks]
        return _collect((f.result() for f in as_completed(futures)), len(tasks), progress)


def _collect(rows: Iterable[dict], total: int,
             progress: Callable[[int, int], None] | None) -> list[dict]:
    results: list[dict | None] = [None] * total
    for done, row in enumerate(rows, 1):
        results[row["index"]] = row
        if progress:
            progress(done, total)
    return results


def _run_on_ray(model, tasks: list[_Task], address: str, *, num_cpus: int | None,
                progress: Callable[[int, int], None] | None) -> list[dict]:
    """The points as Ray tasks, one CPU each; the model (traces included) goes to the object
    store once, pickled by Ray's cloudpickle."""
    try:
        import ray
    except ImportError:
        raise ConstraintError("--ray needs Ray on this machine: pip install 'autoplan[ray]'.") from None
    options = {"num_cpus": num_cpus} if address == "local" and num_cpus else {}
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True,
             log_to_driver=False, include_dashboard=False, **options)
    try:
        solve = ray.remote(num_cpus=1)(_solve_point)
        shared = ray.put(model)
        pending = [solve.remote(shared, task) for task in tasks]

        def finished():
            nonlocal pending
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                yield ray.get(ready[0])

        return _collect(finished(), len(tasks), progress)
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------------------------------
# Metrics and Pareto fronts


def metrics(row: dict, *, price_per_gpu_hour: float | dict[str, float],
            train_tokens: float) -> dict | None:
    """GPUs, cost per million tokens, days to train ``train_tokens``, memory headroom."""
    est, plan = row.get("estimate"), row.get("plan")
    if not plan:
        return None
    gpus = plan["world_size"]
    tokens_per_s = est["tokens_per_s"]
    dollars_per_s = gpu_hour_price(price_per_gpu_hour, row.get("gpu", "")) * gpus / 3600.0
    return {
        "gpus": gpus,
        "cost_per_million_tokens": dollars_per_s / tokens_per_s * 1e6,
        "time_to_train_days": train_tokens / tokens_per_s / 86400.0,
        "headroom_gib": est["memory_limit_gib"] - est["peak_memory_gib"],
    }


def _objectives(front: str, row: dict) -> tuple[float, float] | None:
    m = row.get("metrics")
    if m is None:
        return None
    est = row["estimate"]
    if front == "time_vs_gpus":
        return est["step_time_s"], m["gpus"]
    if front == "cost_vs_time":
        return m["cost_per_million_tokens"], m["time_to_train_days"]
    return -m["headroom_gib"], -est["tokens_per_s"]


def mark_fronts(rows: list[dict]) -> None:
    """Add ``fronts`` (membership of each front) and ``pareto`` (the first front) to rows."""
    masks = {f: pareto_mask([_objectives(f, r) for r in rows]) for f in FRONTS}
    for i, row in enumerate(rows):
        row["fronts"] = {f: masks[f][i] for f in FRONTS}
        row["pareto"] = masks[FRONTS[0]][i]


def document(inputs: list[PointInputs], rows: list[dict], *,
             price_per_gpu_hour: float | dict[str, float],
             train_tokens: float, model_name: str, wall_time_s: float) -> dict:
    """The ``sweep --json`` document."""
    out = []
    for point, row in zip(inputs, rows):
        entry = {"inputs": point.set_values(), "plan": row["plan"], "estimate": row["estimate"],
                 "solver": row["solver"], "runtime": row.get("runtime")}
        if row["plan"] is None:
            entry["error"] = row["error"]
        if "calibration" in row:
            entry["calibration"] = row["calibration"]
        entry["metrics"] = metrics(row, price_per_gpu_hour=price_per_gpu_hour,
                                   train_tokens=train_tokens)
        out.append(entry)
    mark_fronts(out)
    return {"model": model_name, "price_per_gpu_hour": price_per_gpu_hour,
            "train_tokens": train_tokens, "wall_time_s": wall_time_s, "points": out}


# ---------------------------------------------------------------------------------------------
# Tables

_PLAN_COLUMNS = tuple(DEGREE[name].plan for name in (
    "tp", "pp", "dp", "cp", "ep", "zero", "mbs", "recompute", "sp", "vpp", "offload"))
"""The plan's degrees in the table (``plan_<Plan field>`` columns), in this order."""
_ESTIMATE_COLUMNS = ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "memory_limit_gib")
_METRIC_COLUMNS = ("gpus", "cost_per_million_tokens", "time_to_train_days", "headroom_gib")


def flat_rows(doc: dict) -> list[dict]:
    """One flat dict per point (the CSV rows)."""
    names = []
    for point in doc["points"]:
        names += [k for k in point["inputs"] if k not in names]
    rows = []
    for point in doc["points"]:
        row = {n: point["inputs"].get(n, "") for n in names}
        plan = Plan.model_validate(point["plan"]) if point["plan"] else None
        est, m = point["estimate"] or {}, point["metrics"] or {}
        row["status"] = point["solver"]["status"] if point["solver"] else "INFEASIBLE"
        row["plan"] = one_line(plan) if plan else ""
        row["runtime"] = point.get("runtime") or ""
        row.update({f"plan_{c}": getattr(getattr(plan, c, ""), "value", getattr(plan, c, ""))
                    for c in _PLAN_COLUMNS})
        row.update({c: est.get(c, "") for c in _ESTIMATE_COLUMNS})
        row.update({c: m.get(c, "") for c in _METRIC_COLUMNS})
        row.update({f"front_{f}": point["fronts"][f] for f in FRONTS})
        row["error"] = point.get("error", "")
        rows.append(row)
    return rows


def write_csv(doc: dict, path: str | Path) -> Path:
    rows = flat_rows(doc)
    path = Path(path)
    with replacing(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["error"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_json(doc: dict, path: str | Path) -> Path:
    return write_atomically(Path(path), json.dumps(doc, indent=2) + "\n")


def render(doc: dict, console) -> None:
    """Print the sweep table (rich): one column per swept input, the fixed ones in the title."""
    from rich.table import Table

    values: dict[str, list] = {}
    for point in doc["points"]:
        for k, v in point["inputs"].items():
            values.setdefault(k, [])
            if v not in values[k]:
                values[k].append(v)
    swept = [k for k in SWEEPABLE if len(values.get(k, ())) > 1]
    fixed = ", ".join(f"{k}={v[0]}" for k, v in values.items() if len(v) == 1)
    table = Table(title=f"sweep: {doc['model']}, {fixed} ({len(doc['points'])} points, "
                        f"{doc['wall_time_s']:.1f} s)", title_justify="left")
    for name in swept + ["plan", "step s", "tok/s", "MFU", "GiB", "$/Mtok", "days", "front"]:
        table.add_column(name, justify="left" if name in ("plan", "front") else "right")
    for point in doc["points"]:
        cells = [str(point["inputs"].get(k, "")) for k in swept]
        if point["plan"] is None:
            table.add_row(*cells, "[red]no fit[/]", *[""] * 7)
            continue
        p, e, m = point["plan"], point["estimate"], point["metrics"]
        fronts = "".join(sym for f, sym in zip(FRONTS, "*$m") if point["fronts"][f])
        table.add_row(
            *cells, f"{one_line(Plan.model_validate(p))} {point.get('runtime') or ''}".rstrip(),
            f"{e['step_time_s']:.3g}",
            f"{e['tokens_per_s']:,.0f}", f"{e['mfu']:.0%}",
            f"{e['peak_memory_gib']:.0f}/{e['memory_limit_gib']:.0f}",
            f"{m['cost_per_million_tokens']:.3g}", f"{m['time_to_train_days']:.3g}", fronts)
    console.print(table)
    console.print("front: * step time vs GPUs, $ cost per token vs time to train, "
                  "m memory headroom vs speed")
    warned = dict.fromkeys(w for point in doc["points"]
                           for w in point.get("calibration", {}).get("warnings", ()))
    for warning in warned:
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
