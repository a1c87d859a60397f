"""The public API and the only module that wires the stages together:
model.py -> LayerGraph (graph.model), cluster.yaml -> Cluster (cluster.loaded), the question
-> Problem (problems), Problem -> search -> Plan + Estimate -> Result (report). Each function
here loads its inputs, calls the stages in order and returns; the logic lives in the stages.
"""

from __future__ import annotations

import importlib
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from autoplan.calibrate import MeasuredProfile, calibrate_machine
from autoplan.cluster.loaded import LoadedCluster, load_cluster
from autoplan.cluster.spec import require_homogeneous
from autoplan.costmodels.problem import Problem
from autoplan.costmodels.profiles import ComputeProfile
from autoplan.costmodels.step import estimate as estimate_plan
from autoplan.errors import ConstraintError, ExportError, NoPlanInTimeError
from autoplan.files import check_writable_folder
from autoplan.frameworks import (AUTO, SideBySide, compare, priced_elsewhere, runtimes_to_search,
                                 searches_side_by_side)
from autoplan.graph.model import Model, load_model
from autoplan.graph.sandbox import DEFAULT_TIME_LIMIT_S as DEFAULT_TRACE_TIME_LIMIT_S
from autoplan.inference import InferencePlacement
from autoplan.inference import place_for_inference as inference_placement
from autoplan.capabilities import missing, pinned_features, require_no_accumulation
from autoplan.options import (SolveOptions, as_options, as_pins, global_batches,
                              mem_limit_bytes, merge_options, options_mem_limit, solve_headroom)
from autoplan.plan import Estimate, Plan, Result, SolverInfo
from autoplan.plugins.importers import ImportedRun, read_run  # noqa: F401 (API)
from autoplan.problems import (Profile, batch_problems, choice, loaded_profile, make_problem,
                               training_settings, training_spec)
from autoplan.report import build_result, load_result, trace_document  # noqa: F401 (API)
from autoplan.run_profile import RunsProfile
from autoplan.search.defaults import plan_for
from autoplan.training import DEFAULT_TIME_LIMIT_S, Constraints, Pins, Precision, Runtime, TrainingSpec

if TYPE_CHECKING:
    from autoplan.explain import Explanation
    from autoplan.search.solve import Solution

MIN_SHARE_S = 0.05
"""The least time one runtime's search gets (it then returns its hint or runs out of time)."""

ModelLike = str | Path | types.ModuleType | Model
"""A model.py path, an imported module defining build_model(), or a loaded Model."""
ClusterLike = str | Path | Mapping[str, Any] | LoadedCluster
"""A cluster.yaml path, an equivalent mapping, or a loaded cluster."""
ProfileLike = str | Path | Profile | None
PinsLike = Mapping[str, Any] | Pins | None
MemLimit = str | float | None
"""A memory cap per GPU: ``"72GiB"`` or bytes."""


def solve(model: ModelLike, cluster: ClusterLike, *, seq_len: int,
          global_batch: int | list[int] | Mapping[str, int] | None = None,
          pins: PinsLike = None, mem_limit: MemLimit = None,
          time_limit_s: float | None = None, precision: str | None = None,
          runtime: str | None = None, attention: str = "flash",
          objective: str | list[str] | None = None,
          min_tokens_per_s: float | None = None, price_per_gpu_hour: float | None = None,
          bounds: Mapping[str, Any] | None = None, max_gpus: int | None = None,
          tp_within_node: bool | None = None, forbid_offload: bool | None = None,
          options: SolveOptions | str | Path | None = None, profile: ProfileLike = None,
          num_workers: int = 1, runners_up: bool = True, optimizer: str | None = None,
          frozen_dtype: str | None = None, headroom: float | None = None,
          optimizer_in_backward: bool | None = None, processes: int | None = None,
          runtime_settings: Mapping[str, Any] | None = None) -> Result:
    """The best plan that fits (fastest by default), with its estimate, the solver's status
    and the best plan of each other (TP, PP) shape.

    Args:
        model: a path to model.py, an imported module, or a loaded :class:`Model`.
        cluster: a path to cluster.yaml, a mapping, or a loaded cluster.
        seq_len: tokens per sequence.
        global_batch: sequences per optimizer step; a list, or ``{"min": a, "max": b}``, lets
            the solver choose (time then compares per token).
        pins: dimensions to fix, by the CLI's names (``{"tp": 8, "zero": 1}``).
        mem_limit: per-GPU cap (``"72GiB"`` or bytes); default: the GPU's memory.
        time_limit_s: solver time limit; the best plan so far is returned with its gap.
        profile: a profile YAML written by ``autoplan calibrate`` (or a ComputeProfile) that
            replaces the catalog's compute profile.
        num_workers: CP-SAT search workers. The plan does not depend on it (nor on the run)
            when the solve finishes within the time limit: see README, "Determinism".
        runners_up: also find the best plan of the next best (TP, PP) shapes (exact, so it
            evaluates candidates the optimum alone did not need; sweeps turn it off).
        processes: how many runtimes are searched side by side, each but one in a forked
            process (default: the CPU cores this process may use); 1 searches them one after
            another here. The plan does not depend on it (as for ``num_workers``); sweeps,
            which solve their points side by side, set 1.
        runtime_settings: fields of the runtime's profile the search prices every plan with,
            as :func:`estimate` takes them (e.g. ``{"tp_comm_overlap": True}``, what
            ``solve --from`` reads from a Megatron-LM launch); one runtime's, so ``runtime``
            must name it.
        objective: ``"time"`` (default), ``"gpus"``, ``"cost"`` or a lexicographic list
            (``["gpus", "time"]``).
        min_tokens_per_s: a throughput every plan must reach (the target of ``"gpus"``).
        price_per_gpu_hour: $ per GPU-hour for the ``"cost"`` report (default 2).
        bounds: ``{"tp": {"max": 4}, "pp": {"min": 2}}`` on tp, pp, dp, mbs, vpp, cp.
        max_gpus: a GPU budget: plans use at most this many GPUs.
        tp_within_node: TP at most a node's GPUs, even when pinned.
        forbid_offload: no CPU offload.
        headroom: fraction of each GPU's memory (or of ``mem_limit``) plans leave free,
            default :data:`DEFAULT_HEADROOM`; 0 fills the GPU to the predicted peak.
        options: a :class:`SolveOptions` or the path of an options YAML; keywords given here
            win over it.
        optimizer: ``"adamw"`` (default), ``"adamw8bit"`` (bitsandbytes) or ``"sgd"``.
        frozen_dtype: storage of the frozen Linear weights: ``"bf16"``, ``"fp16"``, ``"int8"``
            or ``"nf4"`` (QLoRA); default: the training precision.
        optimizer_in_backward: step each parameter as its gradient is complete (torchtune's
            ``optimizer_in_bwd``; FSDP runtime only, one micro-batch per step).

    Raises:
        InfeasibleError: nothing qualifies; the message names the conflicting requirements.
    """
    opts = as_options(options)
    model = load_model(model, trace_time_limit_s=opts.trace_timeout or DEFAULT_TRACE_TIME_LIMIT_S)
    cluster, profile = load_cluster(cluster), loaded_profile(profile)
    batches = global_batches(global_batch if global_batch is not None else opts.global_batch)
    seq_len, _, precision, runtime = training_settings(
        None, seq_len, (batches or [0])[0], precision, runtime, default_runtime=AUTO)
    constraints = merge_options(opts, cluster.cluster, pins=as_pins(pins), bounds=bounds,
                               max_gpus=max_gpus, objective=objective,
                               min_tokens_per_s=min_tokens_per_s,
                               price_per_gpu_hour=price_per_gpu_hour,
                               tp_within_node=tp_within_node, forbid_offload=forbid_offload,
                               time_limit_s=time_limit_s or DEFAULT_TIME_LIMIT_S)
    mem_limit = mem_limit if mem_limit is not None else options_mem_limit(opts, cluster.cluster)

    def solve_for(one: Runtime, zero: int | None = None) -> Result:
        """The best plan on runtime ``one`` (at ZeRO stage ``zero``: no runners-up, and a
        ZeRO stage that fits nothing is not explained), in an equal share of the time left
        among the runtimes still to solve (ZeRO variants, solved last, in what is left)."""
        left = start + constraints.time_limit_s - time.perf_counter()
        if zero is not None and left <= 0:
            raise NoPlanInTimeError("no time left for the ZeRO-2/ZeRO-3 comparison")
        share = (left if zero is not None or side_by_side
                 else left / (len(runnable) - runnable.index(one)))
        pinned = constraints if zero is None else constraints.model_copy(update={
            "pins": constraints.pins.model_copy(update={"zero": zero})})
        problems = batch_problems(model, cluster, batches, pinned.pins, seq_len=seq_len,
                                  precision=precision, runtime=one.value, attention=attention,
                                  mem_limit=mem_limit, profile=profile,
                                  optimizer=optimizer or opts.optimizer,
                                  frozen_dtype=frozen_dtype or opts.frozen_dtype,
                                  optimizer_in_backward=(
                                      opts.optimizer_in_backward if optimizer_in_backward is None
                                      else optimizer_in_backward),
                                  headroom=solve_headroom(headroom, opts), made=made,
                                  runtime_settings=runtime_settings)
        result, solution = _solve_problems(problems, model, cluster, pinned,
                                           num_workers=num_workers,
                                           time_limit_s=max(share, MIN_SHARE_S),
                                           profile=profile, explain=zero is None)
        if zero is None and solution is not None:
            solutions[one] = solution
        return result

    def at_zero(one: Runtime, zero: int) -> tuple[Plan, Estimate]:
        """The best plan of runtime ``one`` at ZeRO stage ``zero`` and its estimate: from that
        runtime's own search where it tells (``Table.best_at_zero``), else a search with the
        stage pinned (``solve_for``)."""
        solution = solutions.get(one)
        found = solution and solution.table.best_at_zero(
            zero, deadline=start + constraints.time_limit_s)
        if found:
            table, row = found
            return table.plans[row], table.estimate(row)
        result = solve_for(one, zero)
        return result.plan, result.estimate

    def runners_up_of(one: Runtime) -> list | None:
        """The runners-up of runtime ``one``'s own search (None where it kept none: node
        groups)."""
        solution = solutions.get(one)
        return None if solution is None else solution.table.runners_up(solution.row)

    start = time.perf_counter()
    solutions: dict[Runtime, Solution] = {}  # each runtime's own search, for the runners-up
    made: dict[TrainingSpec, Problem] = {}  # a ZeRO re-solve reuses its runtime's evaluations
    choice(Precision, precision, "--precision")  # before the runtimes are asked for it
    searched = runtimes_to_search(runtime)
    if runtime_settings and len(searched) > 1:
        raise ConstraintError(
            f"runtime settings ({', '.join(sorted(runtime_settings))}) are one runtime's: "
            "name it (--runtime megatron, deepspeed or fsdp) or drop the settings.")
    features = pinned_features(constraints.pins, precision,
                               node_groups=not cluster.cluster.is_homogeneous)
    runnable = [r for r in searched if not missing(r, features)]  # they share the time limit
    side_by_side = searches_side_by_side(processes, len(runnable))
    if side_by_side:  # here, once, before the searches fork: they inherit them
        importlib.import_module("autoplan.search.solve" if cluster.cluster.is_homogeneous
                                else "autoplan.search.hetero")  # CP-SAT, numpy
        model.trace(seq_len, precision)  # (a trace started earlier works on meanwhile)
    zero_pinned = constraints.pins.zero is not None or not runners_up
    with SideBySide(runnable, solve_for, at_zero, runners_up_of if runners_up else None,
                    zero_pinned=zero_pinned,
                    side_by_side=side_by_side) as searches:
        best = compare(searches.solve_for, searched, features, objective=constraints.objective,
                       per_token=len(batches or []) > 1, time_limit_s=constraints.time_limit_s,
                       zero_pinned=zero_pinned, at_zero=searches.at_zero)
        found = searches.runners_up(Runtime(best.training.runtime))  # the chosen runtime's
        if found is not None:
            best = best.model_copy(update={"runners_up": found})
    priced = priced_elsewhere(best, model, cluster, mem_limit=mem_limit, profile=profile,
                              attention=attention)
    solver = best.solver.model_copy(update={"wall_time_s": time.perf_counter() - start})
    return best.model_copy(update={"solver": solver, "estimates_by_runtime": priced or None})


def _solve_problems(problems: list[Problem], model: Model, cluster: LoadedCluster,
                    constraints: Constraints, *, num_workers: int, time_limit_s: float,
                    profile: Profile | None = None, explain: bool = True) -> tuple[Result, Solution | None]:
    """The best plan of one runtime's problems (one per allowed global batch), with the
    search that found it (None on node groups, which have no runners-up)."""
    if not cluster.cluster.is_homogeneous:  # stages on node groups; no runners-up
        from autoplan.search.hetero import solve_on_groups  # CP-SAT, as solve_search below
        found = solve_on_groups(problems, constraints.pins, time_limit_s=time_limit_s,
                                objective=constraints.objective, bounds=constraints.bounds,
                                max_gpus=constraints.max_gpus)
        return build_result(found.problem, model, cluster, found.plan, found.estimate,
                            found.info, profile), None
    from autoplan.search.solve import solve_search  # CP-SAT: loaded by the commands that solve

    solution = solve_search(problems, constraints.pins, time_limit_s=time_limit_s,
                            objective=constraints.objective, bounds=constraints.bounds,
                            max_gpus=constraints.max_gpus, num_workers=num_workers,
                            explain=explain)
    return build_result(solution.problem, model, cluster, solution.plan, solution.estimate,
                        solution.info, profile), solution


def estimate(model: ModelLike, cluster: ClusterLike,
             plan_or_pins: Plan | PinsLike | ImportedRun, *, seq_len: int | None = None,
             global_batch: int | None = None, mem_limit: MemLimit = None,
             precision: str | None = None, runtime: str | None = None,
             attention: str = "flash", profile: ProfileLike = None,
             runtime_settings: Mapping[str, Any] | None = None, optimizer: str | None = None,
             frozen_dtype: str | None = None, optimizer_in_backward: bool = False) -> Result:
    """Evaluate one plan: a Plan, pins completed with documented defaults, or an
    :class:`ImportedRun` read from a Megatron-LM, DeepSpeed or torchtitan configuration
    (``read_run(path)``), which may also supply the sequence length, the global batch and
    runtime settings its framework flags fix (e.g. Megatron-LM's ``--tp-comm-overlap``).
    ``profile`` replaces the compute profile as in :func:`solve`; ``runtime_settings`` fields
    of the runtime's profile (:func:`autoplan.problems.runtime_with`); ``optimizer``, ``frozen_dtype`` and
    ``optimizer_in_backward`` as in :func:`solve`."""
    start = time.perf_counter()
    model, cluster, profile = load_model(model), load_cluster(cluster), loaded_profile(profile)
    run = plan_or_pins if isinstance(plan_or_pins, ImportedRun) else None
    seq_len, global_batch, precision, runtime = training_settings(
        run, seq_len, global_batch, precision, runtime)
    training = training_spec(seq_len, global_batch, precision, runtime, attention, optimizer,
                             frozen_dtype, optimizer_in_backward)
    if run is not None and run.runtime == runtime:  # the file's framework flags, then the caller's
        runtime_settings = {**run.runtime_settings, **(runtime_settings or {})}
    problem = make_problem(model, cluster, training, mem_limit, profile=profile,
                           runtime_settings=runtime_settings)
    plan = plan_for(problem, model, plan_or_pins)
    if optimizer_in_backward:
        require_no_accumulation(plan)
    est = estimate_plan(problem, plan)
    info = SolverInfo(status="ESTIMATE", objective=est.step_time_s, bound=est.step_time_s, gap=0.0,
                      wall_time_s=time.perf_counter() - start)
    return build_result(problem, model, cluster, plan, est, info, profile)


def place_for_inference(model: ModelLike, cluster: ClusterLike, *, context_len: int,
                        batch: int = 1, mem_limit: MemLimit = None) -> InferencePlacement:
    """A Hugging Face ``device_map`` (module name -> GPU index) that fits the model for
    inference with ``context_len`` tokens of KV cache, and the predicted time per token."""
    if context_len < 1 or batch < 1:
        raise ConstraintError(f"context_len {context_len} and batch {batch}: both must be at "
                              "least 1.")
    model, cluster = load_model(model), load_cluster(cluster)
    require_homogeneous(cluster.cluster, "inference placement")
    graph = model.trace(min(context_len, 2048))
    return inference_placement(graph, cluster.cluster, context_len=context_len, batch=batch,
                               mem_limit_bytes=mem_limit_bytes(mem_limit, cluster.cluster))


def verify(model: ModelLike, plan_or_result: Plan | Result | str | Path, *, steps: int = 5,
           seq_len: int | None = None, trace_time_limit_s: float | None = None) -> dict:
    """Train ``plan_or_result`` on CPU, one gloo process per rank, next to a single-process
    reference with the same weights and batches; return losses and per-rank memory.

    Args:
        model: the model.py the plan was made for (a path: the ranks import it themselves).
        plan_or_result: a :class:`Result` (or the path of ``solve --json`` output) or a bare
            :class:`Plan`, which then needs ``seq_len``.
        steps: optimizer steps to run.
        trace_time_limit_s: how long model.py may take to import and trace (the default of
            :func:`load_model` when None).

    Returns:
        The ``autoplan verify --json`` document (see :mod:`autoplan.verify.runner`).

    Raises:
        VerifyError: the plan cannot run here, or a rank failed.
    """
    from autoplan.verify.document import verify_result  # torch: loaded by verify only

    return verify_result(model, plan_or_result, steps=steps, seq_len=seq_len,
                         trace_time_limit_s=trace_time_limit_s)


def explain(result: Result | str | Path, model: ModelLike, *, pins: PinsLike = None,
            profile: ProfileLike = None) -> Explanation:
    """Why a plan: binding constraint, runners-up per (TP, PP), what-ifs, warnings.

    Args:
        result: a :class:`Result` or the path of a ``solve --json`` document.
        model: the model.py (path, module or loaded Model) the plan was made for; the plan JSON
            carries the cluster and training settings but not the traced graph.
        pins: the pins the plan was solved under (runners-up and what-ifs keep them).
        profile: a calibration profile to cost the runners-up and what-ifs with (as solve);
            where it may not hold, its warnings join the explanation's.
    """
    from autoplan.explain import explain_result

    result = result if isinstance(result, Result) else load_result(result)
    return explain_result(result, model, pins, profile)


def check_export_out(folder: str | Path) -> None:
    """Refuse an ``--out`` folder for launch files that is a file or cannot be written (called
    before the solve, which may take minutes).

    Raises:
        ExportError: saying what is wrong.
    """
    check_writable_folder(Path(folder), error=ExportError)


def plot_plan(result: Result, folder: str | Path, *, force: bool = False) -> list[Path]:
    """Memory per stage against the limit, and the plan laid out on the cluster (PNG).

    Raises:
        OutputExistsError: a figure exists and ``force`` is false (nothing is written).
    """
    from autoplan.plots import plot_plan as plot  # matplotlib: loaded by --plots only

    return plot(result, folder, force=force)


def calibrate(out: str | Path, *, device: str | None = None, quick: bool = False
              ) -> tuple[MeasuredProfile, ComputeProfile]:
    """Measure this machine (GEMMs, memory copy, all-reduce with several GPUs), write the
    profile YAML to ``out`` and return it with the compute profile fitted from it.
    ``device`` None: cuda when a GPU is visible, else cpu."""
    return calibrate_machine(out, device=device, quick=quick)


def draw_topology(cluster: LoadedCluster, path: str | Path, *, force: bool = False) -> Path:
    """A PNG of the cluster's topology at ``path``, written atomically.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is false.
    """
    from autoplan.cluster.render import write_topology_png

    return write_topology_png(cluster.cluster, path, force=force)


def calibrate_runs(runs: list[str | Path], out: str | Path, *, model: ModelLike | None = None,
                   cluster: ClusterLike | None = None,
                   force: bool = False, leave_one_out: bool = True) -> RunsProfile:
    """Fit the global physical parameters (costmodels.parameters) to measured runs and write
    the profile YAML to ``out`` (autoplan.run_profile).

    Args:
        runs: runs.csv files and/or training logs (Megatron-LM, torchtitan), each log next to
            the configuration that produced it (autoplan.runs).
        model, cluster: the model.py and cluster.yaml of the logs (a runs.csv names its own).
        force: overwrite an existing ``out``.
        leave_one_out: also refit without each run and predict it (the LORO error).

    Raises:
        RunsError: a row or log that cannot be used (the message names row and column).
        OutputExistsError: ``out`` exists and ``force`` is false.
    """
    from autoplan.calibration_runs import calibrate_runs as fit_and_write  # scipy

    return fit_and_write(runs, out, model=model, cluster=cluster, force=force,
                         leave_one_out=leave_one_out)
