"""The ``autoplan`` command: parse, call the API, print. Nothing else lives here.

Exit codes: 0 ok, 2 bad input, 3 infeasible, 4 time limit hit with no plan. Errors are one
paragraph on stderr, never a traceback.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console

from autoplan.capabilities import target_names
from autoplan.degrees import DEGREE, DEGREES
from autoplan.errors import AutoplanError, PlanFileError
from autoplan.graph.sandbox import DEFAULT_TIME_LIMIT_S as DEFAULT_TRACE_TIME_LIMIT_S
from autoplan.graph.trace_cache import DISABLE_ENV as NO_CACHE_ENV
from autoplan.plan import Offload, Recompute, Result
from autoplan.training import DEFAULT_TIME_LIMIT_S

if TYPE_CHECKING:
    from autoplan.plugins.importers import ImportedRun

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan tensor/pipeline/data parallelism for training a PyTorch model.")
PIPED_WIDTH = 1000
"""Columns for output into a pipe or file, which has no width: rich would take 80 and cut
wide tables (the trace's layer names); a terminal keeps its own width."""
stdout = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
stderr = Console(stderr=True)


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Say on stderr what happened: "
                                 "the trace (or its cache), the shapes the search bounded, "
                                 "expanded and pruned, and why it stopped."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Trace model.py afresh: neither "
                                  "read nor write the trace cache (~/.cache/autoplan)."),
) -> None:
    """Plan tensor/pipeline/data parallelism for training a PyTorch model."""
    _log_to_stderr(verbose)
    if no_cache:
        os.environ[NO_CACHE_ENV] = "1"


def _log_to_stderr(verbose: bool) -> None:
    """With ``verbose``, autoplan's info lines on the current stderr through one handler
    (replaced on each call, so repeated in-process invocations do not print twice); without,
    logging as it was (warnings through the root logger)."""
    package = logging.getLogger("autoplan")
    for handler in [h for h in package.handlers if getattr(h, "autoplan_cli", False)]:
        package.removeHandler(handler)
    package.setLevel(logging.INFO if verbose else logging.NOTSET)
    package.propagate = not verbose
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.autoplan_cli = True
        package.addHandler(handler)


ZeroChoice = Enum("ZeroChoice", [(f"Z{z}", str(z)) for z in
                                 range(DEGREE["zero"].low, DEGREE["zero"].high + 1)], type=str)
"""The --zero choices, listed in --help."""


ExportTarget = Enum("ExportTarget", [(name, name) for name in [*target_names(), "all"]], type=str)
"""The targets of --to and --export: every exporter registered under the ``autoplan.exporters``
entry points (a third-party one too), and all."""


MODEL = typer.Argument(..., help="model.py defining build_model().")
CLUSTER = typer.Argument(..., help="cluster.yaml describing the GPUs and links.")
SEQ_LEN = typer.Option(None, "--seq-len", min=1,
                       help="Tokens per sequence (required unless --from states it).")
GLOBAL_BATCH = typer.Option(None, "--global-batch", min=1,
                            help="Sequences per optimizer step (required unless --from states it).")
FROM = typer.Option(None, "--from", help="A Megatron-LM argument list or launch script, a "
                    "DeepSpeed ds_config.json, or torchtitan overrides: the setup you run now.")


def _pins(given: dict) -> dict:
    """The pin options set among ``given`` (a command's parameters, named as the degrees of
    ``autoplan.degrees``), as plain values: enum choices by value, --zero as an int."""
    return {d.name: int(v.value) if isinstance(v, ZeroChoice) else getattr(v, "value", v)
            for d in DEGREES if (v := given.get(d.name)) is not None}


def _emit(result: Result, as_json: bool, *, current: Optional[Result] = None) -> None:
    """Print the result; with ``current`` (the setup read by --from) compare the two. In JSON
    the current setup's document goes under ``"current"``."""
    if as_json:
        document = result.model_dump(mode="json")
        if current is not None:
            document["current"] = current.model_dump(mode="json")
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    from autoplan.report import render, render_comparison
    render(result, stdout)
    if current is not None:
        render_comparison(current, result, stdout)


def _fail(err: AutoplanError) -> None:
    stderr.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code)


def _run(action):
    """Run ``action``, turning user errors into a message and their exit code."""
    try:
        return action()
    except AutoplanError as err:
        _fail(err)


def _searched(action):
    """``_run`` with Python's cyclic garbage collector off: a search builds hundreds of
    thousands of lasting records (plans, memo keys, costs) that the collector scans over and
    over (about 9% of a 1T solve's CPU time, 5% of a 530B one's) while freeing next to nothing
    (reference counting frees them: a 1T solve peaks at the same memory without it). It is
    switched back on afterwards, for whatever else runs in the process (tests, notebooks)."""
    gc.disable()
    try:
        return _run(action)
    finally:
        gc.enable()


# Plan options shared by solve (where they pin) and estimate (where unset ones take defaults).
def _pin_option(name: str, *, listed: bool = False):
    """The option of one degree: its flag, bounds and help from ``autoplan.degrees``;
    ``listed``: its values are choices (``ZeroChoice``, built from the same bounds), no range."""
    degree = DEGREE[name]
    ranged = {} if listed else {"min": degree.low, "max": degree.high}
    return typer.Option(None, degree.flag, **ranged, help=degree.doc)


TP, PP, DP, CP = _pin_option("tp"), _pin_option("pp"), _pin_option("dp"), _pin_option("cp")
MBS, ZERO, RECOMPUTE = _pin_option("mbs"), _pin_option("zero", listed=True), _pin_option("recompute")
RECOMPUTE_LAYERS, SP = _pin_option("recompute_num_layers"), _pin_option("sp")
VPP, OFFLOAD = _pin_option("vpp"), _pin_option("offload")
PLACEMENT, EP = _pin_option("placement"), _pin_option("ep")
MEM_LIMIT = typer.Option(None, "--mem-limit", help="Per-GPU memory cap, e.g. 72GiB (default: the GPU's).")
RUNTIME = typer.Option(None, "--runtime", help="solve: auto (default: compare Megatron-LM, "
                       "DeepSpeed and FSDP and keep the best), megatron, deepspeed or fsdp; "
                       "estimate: megatron (default), deepspeed or fsdp.")
PRECISION = typer.Option(None, "--precision", help="bf16 (default), fp16 or fp8 (Transformer Engine, hybrid; H100 and newer).")
OPTIMIZER = typer.Option(None, "--optimizer", help="adamw (default), adamw8bit (bitsandbytes "
                         "8-bit states) or sgd (with momentum).")
FROZEN_DTYPE = typer.Option(None, "--frozen-dtype", help="Storage of frozen Linear weights: "
                            "bf16, fp16, int8 or nf4 (QLoRA 4-bit; default: --precision).")
IN_BACKWARD = typer.Option(None, "--optimizer-in-backward/--no-optimizer-in-backward",
                           help="Step each parameter as soon as its gradient is complete and free "
                           "it (torchtune's optimizer_in_bwd): gradients of one layer, not the "
                           "model's; FSDP runtime, no gradient accumulation.")
PROFILE = typer.Option(None, "--profile", help="A profile YAML from `autoplan calibrate`: "
                       "replaces the catalog's compute efficiencies (or, from `calibrate "
                       "--runs`, the parameters fitted to your runs).")
JSON = typer.Option(False, "--json", help="Print one JSON document and nothing else.")
TRACE_TIMEOUT = typer.Option(
    None, "--trace-timeout", min=0.1, metavar="SECONDS",
    help=f"Stop importing and tracing model.py after this long (default "
         f"{DEFAULT_TRACE_TIME_LIMIT_S:g} s).")


def _read_run(path: Path) -> ImportedRun:
    """The setup of --from FILE; what was inferred from fields it leaves out goes to stderr."""
    from autoplan import api  # here, not at the top: --help imports no stage
    run = api.read_run(path)
    for note in run.notes:
        stderr.print(f"note: {path.name}: {note}", highlight=False, soft_wrap=True)
    return run


def _model(path: Path, trace_timeout: Optional[float], options: Optional[Path] = None):
    """model.py with --trace-timeout when given (or the default, without --options); else the
    path (the options file's trace_timeout, or the default, then applies)."""
    from autoplan.graph.model import load_model  # not at the top: --help imports no stage
    if trace_timeout is None and options is not None:
        return path
    return _run(lambda: load_model(path, trace_time_limit_s=trace_timeout
                                   or DEFAULT_TRACE_TIME_LIMIT_S))


@app.command()
def solve(
    model: Path = MODEL, cluster: Path = CLUSTER, seq_len: Optional[int] = SEQ_LEN,
    global_batch: Optional[int] = GLOBAL_BATCH, from_file: Optional[Path] = FROM,
    tp: Optional[int] = TP, pp: Optional[int] = PP,
    dp: Optional[int] = DP, cp: Optional[int] = CP, mbs: Optional[int] = MBS,
    zero: Optional[ZeroChoice] = ZERO, recompute: Optional[Recompute] = RECOMPUTE,
    recompute_num_layers: Optional[int] = RECOMPUTE_LAYERS, sp: Optional[bool] = SP, vpp: Optional[int] = VPP, offload: Optional[Offload] = OFFLOAD,
    placement: Optional[str] = PLACEMENT, ep: Optional[int] = EP,
    mem_limit: Optional[str] = MEM_LIMIT, runtime: Optional[str] = RUNTIME,
    precision: Optional[str] = PRECISION, profile: Optional[Path] = PROFILE,
    optimizer: Optional[str] = OPTIMIZER, frozen_dtype: Optional[str] = FROZEN_DTYPE,
    optimizer_in_backward: Optional[bool] = IN_BACKWARD, as_json: bool = JSON,
    headroom: Optional[float] = typer.Option(
        None, "--headroom", help="Fraction of each GPU's memory plans leave free (default 0.05)."),
    time_limit: float = typer.Option(DEFAULT_TIME_LIMIT_S, "--time-limit", min=0.1,
                                     help="Solver time limit in seconds; the best plan so far is returned."),
    export: Optional[ExportTarget] = typer.Option(None, "--export", help="Also write launch files."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for --export."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files in --out."),
    explain: bool = typer.Option(False, "--explain", help="Also say why this plan (see `explain`)."),
    options: Optional[Path] = typer.Option(
        None, "--options", help="YAML of objective, pins, bounds, mem_limit, headroom, max_gpus, "
        "global_batch, tp_within_node, forbid_offload, optimizer, frozen_dtype, "
        "optimizer_in_backward, trace_timeout; "
        "flags given here win."),
    objective: Optional[str] = typer.Option(
        None, "--objective", help="time (default), gpus, cost, or a lexicographic list: gpus,time."),
    min_tokens_per_s: Optional[float] = typer.Option(
        None, "--min-tokens-per-s", min=0, help="Throughput every plan must reach."),
    price: Optional[float] = typer.Option(
        None, "--gpu-hour-price", min=0, help="$ per GPU-hour for --objective cost (default 2)."),
    trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Find the fastest plan that fits in memory (or the fewest GPUs, or the cheapest, with
    --objective); given options pin those dimensions. With --from, also price the setup you run
    now and say what to change."""
    pins = _pins(locals())
    model = _model(model, trace_timeout, options)
    if seq_len is not None and from_file is None and not isinstance(model, Path):
        model.start_trace(seq_len, precision or "bf16")  # traced while the search is imported
    from autoplan import api  # here, not at the top: --help imports no stage
    if export is not None:  # before the solve, which may take minutes
        if out is None:
            _fail(_NO_OUT)
        _run(lambda: api.check_export_out(out))
    current, settings = None, None
    if from_file is not None:
        run = _read_run(from_file)
        current = _searched(lambda: api.estimate(
            model, cluster, run, seq_len=seq_len, global_batch=global_batch,
            mem_limit=mem_limit, runtime=runtime, precision=precision, profile=profile,
            optimizer=optimizer, frozen_dtype=frozen_dtype,
            optimizer_in_backward=bool(optimizer_in_backward)))
        training = current.training
        seq_len, global_batch = training.seq_len, training.global_batch
        runtime, precision = training.runtime, training.precision
        if run.runtime == runtime:  # the optimum priced with the framework flags you run
            settings = dict(run.runtime_settings) or None
    terms = objective.split(",") if objective else None
    result = _searched(lambda: api.solve(
        model, cluster, seq_len=seq_len, global_batch=global_batch, pins=pins,
        mem_limit=mem_limit, time_limit_s=time_limit, runtime=runtime, precision=precision,
        objective=terms, min_tokens_per_s=min_tokens_per_s, price_per_gpu_hour=price,
        options=options, profile=profile, optimizer=optimizer, frozen_dtype=frozen_dtype,
        headroom=headroom, optimizer_in_backward=optimizer_in_backward,
        runtime_settings=settings))
    if explain:
        explanation = _searched(lambda: api.explain(result, model, pins=pins, profile=profile))
    # Written (or refused) before anything is printed: a refusal leaves stdout empty.
    written = _export(result, export, out, force) if export is not None else []
    if explain and as_json:
        document = {**result.model_dump(mode="json"), "explanation": explanation.model_dump(mode="json")}
        if current is not None:
            document["current"] = current.model_dump(mode="json")
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        _emit(result, as_json, current=current)
        if explain:
            _emit_explanation(explanation, False)
    if not as_json:
        _print_written(written, _refused(result, export))


@app.command()
def estimate(
    model: Path = MODEL, cluster: Path = CLUSTER, seq_len: Optional[int] = SEQ_LEN,
    global_batch: Optional[int] = GLOBAL_BATCH, from_file: Optional[Path] = FROM,
    tp: Optional[int] = TP, pp: Optional[int] = PP,
    dp: Optional[int] = DP, cp: Optional[int] = CP, mbs: Optional[int] = MBS,
    zero: Optional[ZeroChoice] = ZERO, recompute: Optional[Recompute] = RECOMPUTE,
    recompute_num_layers: Optional[int] = RECOMPUTE_LAYERS, sp: Optional[bool] = SP, vpp: Optional[int] = VPP, offload: Optional[Offload] = OFFLOAD,
    placement: Optional[str] = PLACEMENT, ep: Optional[int] = EP,
    mem_limit: Optional[str] = MEM_LIMIT, runtime: Optional[str] = RUNTIME,
    precision: Optional[str] = PRECISION, profile: Optional[Path] = PROFILE,
    optimizer: Optional[str] = OPTIMIZER, frozen_dtype: Optional[str] = FROZEN_DTYPE,
    optimizer_in_backward: Optional[bool] = IN_BACKWARD,
    as_json: bool = JSON, trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Evaluate one plan. Unset dimensions default to tp=pp=cp=1, dp = the most GPUs left that
    divide the global batch, mbs=1, ZeRO-0, no recompute, no SP, no interleaving, no offload."""
    from autoplan import api  # here, not at the top: --help imports no stage
    pins = _pins(locals())

    def plan():
        if from_file is None:
            return pins
        run = _read_run(from_file)  # pins on the command line override the file's
        return dataclasses.replace(run, pins={**run.pins, **pins})

    model = _model(model, trace_timeout)
    result = _searched(lambda: api.estimate(
        model, cluster, plan(), seq_len=seq_len, global_batch=global_batch, mem_limit=mem_limit,
        runtime=runtime, precision=precision, profile=profile, optimizer=optimizer,
        frozen_dtype=frozen_dtype, optimizer_in_backward=bool(optimizer_in_backward)))
    _emit(result, as_json)


@app.command()
def trace(
    model: Path = MODEL,
    seq_len: int = typer.Option(2048, "--seq-len", help="Tokens per sequence."),
    batch: int = typer.Option(1, "--batch", min=1, help="Sequences (figures scale linearly)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Print the traced layer table of a model."""
    from autoplan import api  # here, not at the top: --help imports no stage
    graph = _run(lambda: api.load_model(_model(model, trace_timeout)).trace(seq_len))
    document = api.trace_document(graph, batch)
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    from autoplan.report import render_trace
    render_trace(document, stdout)


_NO_OUT = PlanFileError("--export needs --out DIR: the folder to write the launch files to.")


def _export(result: Result, target: ExportTarget, out: Optional[Path], force: bool) -> list[Path]:
    if out is None:
        _fail(_NO_OUT)
    from autoplan.plugins import export_plan
    return _run(lambda: export_plan(result, target.value, out, force=force))


def _print_written(paths: list[Path], refused: list[str] = ()) -> None:
    for path in paths:
        stdout.print(f"wrote {path}")
    for line in refused:
        stdout.print(f"not exported: {line}", highlight=False, soft_wrap=True)


def _refused(result: Result, target: Optional[ExportTarget]) -> list[str]:
    """For --export all: the targets that cannot run the plan, and why."""
    if target is not ExportTarget.all:
        return []
    from autoplan.plugins import refused_targets
    return refused_targets(result)


@app.command("export")
def export_cmd(
    plan_json: Path = typer.Argument(..., help="What `autoplan solve --json` printed."),
    to: ExportTarget = typer.Option(..., "--to", help="Target framework, or all."),
    out: Path = typer.Option(..., "--out", help="Folder to write the files to."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Write launch files for a plan saved from `solve --json`."""
    from autoplan import api  # here, not at the top: --help imports no stage
    result = _run(lambda: api.load_result(plan_json))
    _run(lambda: api.check_export_out(out))
    _print_written(_export(result, to, out, force), _refused(result, to))


@app.command()
def topo(
    cluster: Path = CLUSTER,
    png: Optional[Path] = typer.Option(None, "--png", help="Also draw the topology to this PNG."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --png file."),
) -> None:
    """Check a cluster.yaml and show its topology: hardware, fabric, group bandwidths."""
    from autoplan import api  # here, not at the top: --help imports no stage
    from autoplan.cluster.render import render_summary
    loaded = _run(lambda: api.load_cluster(cluster))
    render_summary(loaded.cluster, stdout)
    if png is not None:
        stdout.print(f"wrote {_run(lambda: api.draw_topology(loaded, png, force=force))}")


@app.command("verify")
def verify_cmd(
    model: Path = MODEL,
    plan_json: Path = typer.Argument(..., help="What `autoplan solve --json` printed."),
    steps: int = typer.Option(5, "--steps", min=1, help="Training steps to run."),
    as_json: bool = JSON, trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Run a plan on CPU (one gloo process per rank) next to a single-process reference and
    compare losses and per-rank memory."""
    from autoplan import api  # here, not at the top: --help imports no stage
    document = _run(lambda: api.verify(model, plan_json, steps=steps,
                                       trace_time_limit_s=trace_timeout))
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    from autoplan.report import render_verify
    render_verify(document, stdout)


@app.command("sweep")
def sweep_cmd(
    source: Path = typer.Argument(..., help="model.py, or a sweep YAML (then no CLUSTER)."),
    cluster: Optional[Path] = typer.Argument(None, help="cluster.yaml (the base of the points)."),
    over: list[str] = typer.Option([], "--over", help="NAME=V1,V2,... e.g. nodes=1,2,4 (repeat)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence, if not swept."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per step, if not swept."),
    mem_limit: Optional[str] = MEM_LIMIT, runtime: Optional[str] = typer.Option(None, "--runtime"),
    precision: Optional[str] = typer.Option(None, "--precision"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: cores)."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Ray address (or local) to run the points on."),
    price: Optional[float] = typer.Option(None, "--gpu-hour-price", help="$ per GPU-hour (default 2)."),
    train_tokens: Optional[float] = typer.Option(None, "--train-tokens", help="Tokens of the run (default 1e12)."),
    time_limit: float = typer.Option(DEFAULT_TIME_LIMIT_S, "--time-limit", min=0.1),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for sweep.csv, sweep.json and plots."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files in --out."),
    profile: Optional[Path] = PROFILE,
    as_json: bool = JSON, trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Solve a grid of inputs in parallel; print the best plan per point and the Pareto fronts."""
    from rich.progress import Progress

    from autoplan import sweep as sweeps

    if out is not None:  # before the sweep, which may take minutes
        _run(lambda: sweeps.check_sweep_out(out, force=force))
    base = {k: v for k, v in {"seq_len": seq_len, "global_batch": global_batch,
                              "mem_limit": mem_limit, "runtime": runtime,
                              "precision": precision}.items() if v is not None}
    with Progress(console=stderr, transient=True) as bar:
        task = bar.add_task("solving points", total=None)
        progress = lambda done, total: bar.update(task, completed=done, total=total)  # noqa: E731
        if cluster is None:
            doc = _searched(lambda: sweeps.sweep_file(source, workers=workers, ray_address=ray,
                                              progress=progress, profile=profile,
                                              trace_time_limit_s=trace_timeout))
        else:
            doc = _searched(lambda: sweeps.sweep(
                _model(source, trace_timeout), cluster, over=_run(lambda: sweeps.parse_over(over)), base=base,
                time_limit_s=time_limit, workers=workers, price_per_gpu_hour=price,
                train_tokens=train_tokens, ray_address=ray, progress=progress,
                profile=profile))
    if out is not None:
        for path in _run(lambda: sweeps.write_sweep(doc, out, force=force)):
            stderr.print(f"wrote {path}")
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sweeps.render(doc, stdout)


@app.command("explain")
def explain_cmd(
    plan_json: Path = typer.Argument(..., help="What `autoplan solve --json` printed."),
    model: Path = typer.Option(..., "--model", help="The model.py the plan was made for."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Folder for memory and placement plots."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing plots in --plots."),
    profile: Optional[Path] = PROFILE,
    as_json: bool = JSON, trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Why this plan: binding constraint, runners-up per TP/PP shape, what-ifs and warnings."""
    from autoplan import api  # here, not at the top: --help imports no stage
    result = _run(lambda: api.load_result(plan_json))
    _emit_explanation(_searched(lambda: api.explain(result, _model(model, trace_timeout),
                                               profile=profile)), as_json)
    if plots is not None:
        for path in _run(lambda: api.plot_plan(result, plots, force=force)):
            stderr.print(f"wrote {path}")


def _emit_explanation(explanation, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(explanation.model_dump(mode="json"), indent=2) + "\n")
    else:
        from autoplan.explain import render
        render(explanation, stdout)


@app.command("infer")
def infer_cmd(
    model: Path = MODEL, cluster: Path = CLUSTER,
    context_len: int = typer.Option(..., "--context-len", min=1,
                                    help="Tokens of context (prompt plus generated) to hold in the KV cache."),
    batch: int = typer.Option(1, "--batch", min=1, help="Sequences generated together."),
    mem_limit: Optional[str] = MEM_LIMIT, as_json: bool = JSON,
    trace_timeout: Optional[float] = TRACE_TIMEOUT,
) -> None:
    """Inference placement: a Hugging Face device_map and the predicted time per generated token."""
    from autoplan import api  # here, not at the top: --help imports no stage
    placement = _run(lambda: api.place_for_inference(_model(model, trace_timeout), cluster, context_len=context_len,
                                                     batch=batch, mem_limit=mem_limit))
    if as_json:
        sys.stdout.write(json.dumps(placement.model_dump(mode="json"), indent=2) + "\n")
        return
    from autoplan.report import render_inference
    render_inference(placement, context_len, batch, stdout)


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(Path("profile.yaml"), "--out", help="Profile YAML to write."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: cuda "
                                         "when a GPU is visible, else cpu)."),
    quick: bool = typer.Option(False, "--quick", help="Tiny shapes: seconds, not minutes."),
    runs: list[Path] = typer.Option(
        [], "--runs", help="Fit to measured runs instead of measuring here: a runs.csv, or a "
        "Megatron-LM/torchtitan training log next to its configuration (repeat)."),
    model: Optional[Path] = typer.Option(None, "--model", help="With a training log: its model.py."),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="With a training log: its cluster.yaml."),
    force: bool = typer.Option(False, "--force", help="With --runs: overwrite an existing --out."),
    as_json: bool = JSON,
) -> None:
    """Measure GEMM throughput, memory bandwidth and (several GPUs) all-reduce bandwidth here
    and write a profile for `solve`/`estimate --profile`; with --runs, fit the cost model's
    global parameters to your measured runs instead."""
    from autoplan import api  # here, not at the top: --help imports no stage
    if runs:
        profile = _run(lambda: api.calibrate_runs(runs, out, model=model, cluster=cluster,
                                                  force=force))
        if as_json:
            sys.stdout.write(json.dumps(profile.model_dump(mode="json", by_alias=True),
                                        indent=2) + "\n")
            return
        from autoplan.report import render_calibration
        render_calibration(profile, stdout)
        stdout.print(f"wrote {out}")
        return
    measured, fitted = _run(lambda: api.calibrate(out, device=device, quick=quick))
    numbers = {"gemm_efficiency": fitted.gemm_efficiency, "gemm_half_flops": fitted.gemm_half_flops,
               "memory_efficiency": fitted.memory_efficiency}
    if as_json:
        sys.stdout.write(json.dumps({"profile": str(out), "device": measured.device,
                                     "dtype": measured.dtype, "fitted": numbers}, indent=2) + "\n")
        return
    from autoplan.report import render_measured
    render_measured(measured, fitted, stdout)
    stdout.print(f"wrote {out}")


def main() -> None:
    """Console entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        app()
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
