"""The public API and the only module that wires the stages together:
model.py -> LayerGraph, cluster.yaml -> Cluster, then Problem -> CP-SAT -> Plan + Estimate.
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pydantic import ValidationError

from autoplan.cluster.spec import Cluster, load_cluster_spec, require_homogeneous, resolve
from autoplan.calibrate import MeasuredProfile, fitted_profile, load_profile, measure, write_profile
from autoplan.costmodels.profiles import (ATTENTION_KERNELS, ComputeProfile, RuntimeProfile,
                                          compute_profile, runtime_profile)
from autoplan.costmodels.groups import check_groups, on_groups_in_order
from autoplan.costmodels.problem import Problem
from autoplan.costmodels.step import estimate as estimate_plan
from autoplan.degrees import of_plan
from autoplan.errors import (AutoplanError, ClusterSpecError, ConstraintError, ExportError,
                             NoPlanInTimeError, OutputExistsError, PlanFileError)
from autoplan.files import check_writable_folder, refuse_existing, write_errors_as
from autoplan.graph.layer_graph import LayerGraph
from autoplan.graph.sandbox import DEFAULT_TIME_LIMIT_S as DEFAULT_TRACE_TIME_LIMIT_S
from autoplan.graph.model import Model, load_model
from autoplan.inference import InferencePlacement
from autoplan.inference import place_for_inference as inference_placement
from autoplan.capabilities import (
    RUNTIMES, can_run, missing, pinned_features, require_in_backward_runtime,
    require_no_accumulation,
)
from autoplan.frameworks import AUTO, compare, runtimes_to_search
from autoplan.plan import (
    CalibrationNote, LoraInfo, ModelInfo, Plan, Result, SolverInfo, TrainingInfo,
)
from autoplan.plugins.importers import ImportedRun, read_run  # noqa: F401 (API)
from autoplan.report import trace_document  # noqa: F401 (API)
from autoplan.search.hetero import solve_on_groups
from autoplan.search.defaults import check_plan_matches, plan_from_pins, with_implied_sp
from autoplan.search.space import check_ep, check_pins, check_tp
from autoplan.run_profile import RunsProfile
from autoplan.options import (SolveOptions, as_options, global_batches, mem_limit_bytes,
                              merge_options, options_mem_limit, solve_headroom, validated)
from autoplan.training import (
    DEFAULT_TIME_LIMIT_S, AttentionKernel, Constraints, FrozenDtype, Optimizer, Pins, Precision,
    Runtime, TrainingSpec,
)

if TYPE_CHECKING:
    from autoplan.explain import Explanation
    from autoplan.search.solve import Solution

MIN_SHARE_S = 0.05
"""The least time one runtime's search gets (it then returns its hint or runs out of time)."""


@dataclass(frozen=True)
class LoadedCluster:
    """A resolved cluster together with the mapping it came from (kept for the plan JSON)."""

    cluster: Cluster
    spec: dict


def load_cluster(path_or_dict: str | Path | Mapping | LoadedCluster) -> LoadedCluster:
    """Load and validate a cluster.yaml (path) or an equivalent mapping."""
    if isinstance(path_or_dict, LoadedCluster):
        return path_or_dict
    if not isinstance(path_or_dict, (str, Path, Mapping)):
        raise ClusterSpecError(f"cluster: expected the path of a cluster.yaml or a mapping; got "
                               f"{type(path_or_dict).__name__}.")
    source = dict(path_or_dict) if isinstance(path_or_dict, Mapping) else path_or_dict
    spec = load_cluster_spec(source)
    return LoadedCluster(resolve(spec), spec.model_dump(mode="json", exclude_none=True))


Profile = ComputeProfile | RunsProfile
ModelLike = str | Path | types.ModuleType | Model
"""A model.py path, an imported module defining build_model(), or a loaded Model."""
ClusterLike = str | Path | Mapping[str, Any] | LoadedCluster
"""A cluster.yaml path, an equivalent mapping, or a loaded cluster."""
ProfileLike = str | Path | Profile | None
PinsLike = Mapping[str, Any] | Pins | None
MemLimit = str | float | None
"""A memory cap per GPU: ``"72GiB"`` or bytes."""


def loaded_profile(profile: str | Path | Profile | None) -> Profile | None:
    """A --profile: None, an already loaded one, or the path of its YAML."""
    if profile is None or isinstance(profile, (ComputeProfile, RunsProfile)):
        return profile
    return load_profile(profile)


def _compute(cluster: Cluster, profile: Profile | None) -> ComputeProfile:
    if isinstance(profile, ComputeProfile):
        return profile
    return compute_profile(cluster.gpu.name)


def make_problem(model: Model, cluster: LoadedCluster, training: TrainingSpec,
                 mem_limit: str | float | None = None, *,
                 profile: str | Path | Profile | None = None,
                 runtime_settings: Mapping[str, Any] | None = None,
                 headroom: float = 0.0) -> Problem:
    """Trace the model and gather the cost-model inputs for one question. ``profile`` (a
    profile YAML from ``autoplan calibrate``, a ComputeProfile or a RunsProfile) replaces the
    catalog's compute profile of the cluster's GPU (of its first node group's GPU on a
    heterogeneous cluster), or, fitted to runs, the parameters it names
    (costmodels.parameters); ``runtime_settings`` replaces fields of the runtime's profile
    (see :func:`runtime_with`); ``headroom`` the fraction of the limit plans must leave free."""
    profile = loaded_profile(profile)
    graph = model.trace(training.seq_len, training.precision.value)
    if not cluster.cluster.is_homogeneous and not graph.block_indices():
        raise ConstraintError(
            f"{model.name} traces into no repeated blocks, so its layers cannot be shared out "
            "over the node groups of a heterogeneous cluster; plan it on one group (give that "
            "group's nodes as a cluster of their own).")
    runtime = runtime_with(runtime_profile(training.runtime.value, training.precision.value),
                           runtime_settings)
    problem = Problem(
        graph=graph, cluster=cluster.cluster, training=training,
        runtime=runtime,
        compute=_compute(cluster.cluster, profile),
        mem_limit_bytes=mem_limit_bytes(mem_limit, cluster.cluster) * (1 - headroom),
        headroom=headroom,
    )
    if isinstance(profile, RunsProfile):
        return profile.apply(problem)
    return problem


def runtime_with(runtime: RuntimeProfile, settings: Mapping[str, Any] | None) -> RuntimeProfile:
    """The runtime's profile with some fields replaced: how a particular run was configured or
    what its framework version could do, e.g. ``{"tp_bwd_overlap": False}`` for Megatron-LM
    before its asynchronous TP all-reduce or ``{"overlap_grad_reduce": False}`` for a launch
    without ``--overlap-grad-reduce``."""
    if not settings:
        return runtime
    known = {f.name for f in dataclasses.fields(RuntimeProfile)} - {"name", "source"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConstraintError(f"runtime settings {', '.join(unknown)} are not known; choose from "
                              f"{', '.join(sorted(known))}.")
    kernel = settings.get("attention_kernel", runtime.attention_kernel)
    if kernel not in ATTENTION_KERNELS:
        raise ConstraintError(f"runtime setting attention_kernel {kernel!r} is not a kernel "
                              f"autoplan prices; choose from {', '.join(ATTENTION_KERNELS)}.")
    return dataclasses.replace(runtime, **settings)


def training_spec(seq_len: int, global_batch: int, precision: str, runtime: str,
              attention: str, optimizer: str | None = None,
              frozen_dtype: str | None = None,
              optimizer_in_backward: bool = False) -> TrainingSpec:
    if optimizer_in_backward:
        require_in_backward_runtime(_choice(Runtime, runtime, "--runtime"))
    return validated(TrainingSpec, {
        "seq_len": seq_len, "global_batch": global_batch,
        "precision": _choice(Precision, precision, "--precision"),
        "runtime": _choice(Runtime, runtime, "--runtime"),
        "attention": _choice(AttentionKernel, attention, "attention"),
        "optimizer": _choice(Optimizer, optimizer or "adamw", "--optimizer"),
        "frozen_dtype": frozen_dtype and _choice(FrozenDtype, frozen_dtype, "--frozen-dtype"),
        "optimizer_in_backward": optimizer_in_backward},
        "training settings")


def _choice(enum, value: str, name: str):
    try:
        return enum(value)
    except ValueError:
        raise ConstraintError(f"{name} {value!r} is not known; choose one of "
                              f"{', '.join(e.value for e in enum)}.") from None


def _pins(pins: Mapping[str, Any] | Pins | None) -> Pins:
    if isinstance(pins, Pins):
        return pins
    return validated(Pins, pins or {}, "pins")


def calibration_note(profile: Profile | None, problem: Problem, plan: Plan
                     ) -> CalibrationNote | None:
    """What a ``calibrate --runs`` profile set, and why it may not hold for this plan."""
    if not isinstance(profile, RunsProfile):
        return None
    return CalibrationNote(
        profile=profile.source, parameters=profile.parameters,
        warnings=profile.warnings(gpu=problem.cluster.gpu.name,
                                  runtime=problem.training.runtime.value,
                                  gpus=plan.world_size, params=problem.graph.num_params))


def _result(problem: Problem, model: Model, cluster: LoadedCluster, plan: Plan, est,
            info: SolverInfo, profile: Profile | None = None) -> Result:
    graph, dims = problem.graph, problem.graph.dims
    model_info = ModelInfo(
        name=model.name, num_params=graph.num_params,
        num_trainable_params=graph.num_trainable_params, seq_len=graph.seq_len,
        layer_kinds=tuple(l.kind.value for l in graph.layers),
        **({k: getattr(dims, k) for k in (
            "hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
            "vocab_size", "gated_mlp", "rmsnorm", "rotary", "tied_embeddings", "linear_bias",
            "rope_theta", "rope_scaling_type", "rope_scaling_factor", "norm_eps")}
           if dims else {}),
        **_moe_info(graph),
        **({"lora": LoraInfo(**dataclasses.asdict(graph.lora))} if graph.lora else {}),
    )
    training = TrainingInfo(seq_len=problem.training.seq_len,
                            global_batch=problem.training.global_batch,
                            precision=problem.training.precision.value,
                            runtime=problem.training.runtime.value,
                            optimizer=problem.training.optimizer.value,
                            frozen_dtype=problem.training.frozen_storage.value,
                            optimizer_in_backward=problem.training.optimizer_in_backward,
                            torch_compile=problem.runtime.compile)
    return Result(plan=plan, estimate=est, solver=info, model=model_info, cluster=cluster.spec,
                  training=training, calibration=calibration_note(profile, problem, plan))


def _moe_info(graph: LayerGraph) -> dict:
    """Experts per MoE layer and experts per token, for exporters; empty for a dense model."""
    moe = [e for layer in graph.layers for e in layer.experts]
    return {"num_experts": moe[0].num_experts, "moe_top_k": moe[0].top_k} if moe else {}


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
          optimizer_in_backward: bool | None = None) -> Result:
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
    seq_len, _, precision, runtime = _settings(None, seq_len, (batches or [0])[0], precision,
                                               runtime, default_runtime=AUTO)
    constraints = merge_options(opts, cluster.cluster, pins=_pins(pins), bounds=bounds,
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
        share = left if zero is not None else left / (len(runnable) - runnable.index(one))
        pinned = constraints if zero is None else constraints.model_copy(update={
            "pins": constraints.pins.model_copy(update={"zero": zero})})
        problems = _batch_problems(model, cluster, batches, pinned.pins, seq_len=seq_len,
                                   precision=precision, runtime=one.value, attention=attention,
                                   mem_limit=mem_limit, profile=profile,
                                   optimizer=optimizer or opts.optimizer,
                                   frozen_dtype=frozen_dtype or opts.frozen_dtype,
                                   optimizer_in_backward=(
                                       opts.optimizer_in_backward if optimizer_in_backward is None
                                       else optimizer_in_backward),
                                   headroom=solve_headroom(headroom, opts), made=made)
        result, solution = _solve_problems(problems, model, cluster, pinned,
                                           num_workers=num_workers,
                                           time_limit_s=max(share, MIN_SHARE_S),
                                           profile=profile, explain=zero is None)
        if zero is None and solution is not None:
            solutions[one] = solution
        return result

    start = time.perf_counter()
    solutions: dict[Runtime, Solution] = {}  # each runtime's own search, for the runners-up
    made: dict[TrainingSpec, Problem] = {}  # a ZeRO re-solve reuses its runtime's evaluations
    _choice(Precision, precision, "--precision")  # before the runtimes are asked for it
    searched = runtimes_to_search(runtime)
    features = pinned_features(constraints.pins, precision,
                               node_groups=not cluster.cluster.is_homogeneous)
    runnable = [r for r in searched if not missing(r, features)]  # they share the time limit
    best = compare(solve_for, searched, features, objective=constraints.objective,
                   per_token=len(batches or []) > 1, time_limit_s=constraints.time_limit_s,
                   zero_pinned=constraints.pins.zero is not None or not runners_up)
    chosen = solutions.get(Runtime(best.training.runtime))
    if runners_up and chosen is not None:  # only the chosen runtime's are reported
        best = best.model_copy(update={"runners_up": chosen.table.runners_up(chosen.row)})
    priced = _priced_elsewhere(best, model, cluster, mem_limit=mem_limit, profile=profile,
                               attention=attention)
    solver = best.solver.model_copy(update={"wall_time_s": time.perf_counter() - start})
    return best.model_copy(update={"solver": solver, "estimates_by_runtime": priced or None})


def _priced_elsewhere(result: Result, model: Model, cluster: LoadedCluster, *, mem_limit,
                      profile, attention: str) -> dict[str, Any]:
    """The chosen plan's estimate on each other runtime whose capability table runs it (by
    runtime name), so that each export is priced for the runtime it targets."""
    t, out = result.training, {}
    for other in Runtime:
        if other.value == t.runtime or not can_run(RUNTIMES[other], result.plan, t.precision,
                                                   uneven=_uneven_chunks(result.plan, model, t)):
            continue
        if t.optimizer_in_backward and not RUNTIMES[other].optimizer_in_backward:
            continue
        training = training_spec(t.seq_len, t.global_batch, t.precision, other.value, attention,
                             t.optimizer, t.frozen_dtype, t.optimizer_in_backward)
        problem = make_problem(model, cluster, training, mem_limit, profile=profile)
        out[other.value] = estimate_plan(problem, result.plan)
    return out


def _uneven_chunks(plan: Plan, model: Model, training: TrainingInfo) -> bool:
    """Whether an interleaved plan's model chunks hold different numbers of blocks."""
    if plan.vpp == 1:
        return False
    blocks = set(model.trace(training.seq_len, training.precision).block_indices())
    counts = {sum(i in blocks for i in range(s.first_layer, s.first_layer + s.num_layers))
              for s in plan.stages}
    return len(counts) > 1


def _solve_problems(problems: list[Problem], model: Model, cluster: LoadedCluster,
                    constraints: Constraints, *, num_workers: int, time_limit_s: float,
                    profile=None, explain: bool = True) -> tuple[Result, Solution | None]:
    """The best plan of one runtime's problems (one per allowed global batch), with the
    search that found it (None on node groups, which have no runners-up)."""
    if not cluster.cluster.is_homogeneous:  # stages on node groups; no runners-up
        found = solve_on_groups(problems, constraints.pins, time_limit_s=time_limit_s,
                                objective=constraints.objective, bounds=constraints.bounds,
                                max_gpus=constraints.max_gpus)
        return _result(found.problem, model, cluster, found.plan, found.estimate, found.info,
                       profile), None
    from autoplan.search.solve import solve_search  # CP-SAT: loaded by the commands that solve

    solution = solve_search(problems, constraints.pins, time_limit_s=time_limit_s,
                            objective=constraints.objective, bounds=constraints.bounds,
                            max_gpus=constraints.max_gpus, num_workers=num_workers,
                            explain=explain)
    return _result(solution.problem, model, cluster, solution.plan, solution.estimate,
                   solution.info, profile), solution


def _batch_problems(model: Model, cluster: LoadedCluster, batches: list[int] | None, pins: Pins,
                    *, seq_len: int, precision: str, runtime: str, attention: str,
                    mem_limit, profile=None, optimizer: str | None = None,
                    frozen_dtype: str | None = None, headroom: float = 0.0,
                    optimizer_in_backward: bool = False,
                    made: dict[TrainingSpec, Problem] | None = None) -> list[Problem]:
    """One problem per allowed global batch whose pins are legal (all checked if none is).
    ``made``: the problems of earlier calls by their training settings, reused (with the memo
    of what was evaluated on them) rather than made again."""
    made = {} if made is None else made
    if not batches:
        raise ConstraintError("give --global-batch (or global_batch in --options).")
    _check_ep_cluster(cluster, pins.ep)
    problems, errors = [], []
    for batch in batches:
        training = training_spec(seq_len, batch, precision, runtime, attention, optimizer,
                             frozen_dtype, optimizer_in_backward)
        if training not in made:
            made[training] = make_problem(model, cluster, training, mem_limit, profile=profile,
                                          headroom=headroom)
        problem = made[training]
        try:
            check_pins(problem.graph, world=cluster.cluster.num_gpus, training=training, pins=pins)
        except ConstraintError as err:
            errors.append(err)
            continue
        problems.append(problem)
    if not problems:
        raise errors[0]
    return problems


def _check_ep_cluster(cluster: LoadedCluster, ep: int | None) -> None:
    """Expert parallelism is costed on clusters of one kind of node only."""
    if ep not in (None, 1) and not cluster.cluster.is_homogeneous:
        raise ConstraintError(
            f"--ep {ep}: expert parallelism is not modelled on a cluster of several node groups "
            "yet; leave --ep unset or plan on one node group.")


def plan_for(problem: Problem, cluster: LoadedCluster, model: Model, plan_or_pins) -> Plan:
    """The plan to estimate: a Plan checked against the problem, or pins (from the caller or an
    imported configuration) completed with the documented defaults."""
    if isinstance(plan_or_pins, Plan):
        check_plan_matches(problem, plan_or_pins, model)
        check_tp(problem.graph, plan_or_pins.tp, world=cluster.cluster.num_gpus)
        if plan_or_pins.world_size > cluster.cluster.num_gpus:
            raise ConstraintError(f"the plan needs {plan_or_pins.world_size} GPUs but the "
                                  f"cluster has {cluster.cluster.num_gpus}.")
        if plan_or_pins.ep > 1:
            _check_ep_cluster(cluster, plan_or_pins.ep)
            check_ep(problem.graph, problem.training,
                     Pins(**of_plan(plan_or_pins, ("ep", "dp", "cp", "tp", "sp"))))
        plan_or_pins = with_implied_sp(problem, plan_or_pins)
        if plan_or_pins.stage_groups is not None:
            check_groups(problem, plan_or_pins)
        elif not cluster.cluster.is_homogeneous:
            return on_groups_in_order(problem, plan_or_pins)
        return plan_or_pins
    run = plan_or_pins if isinstance(plan_or_pins, ImportedRun) else None
    pins = _pins(run.pins if run else plan_or_pins)
    _check_ep_cluster(cluster, pins.ep)
    check_pins(problem.graph, world=cluster.cluster.num_gpus, training=problem.training, pins=pins)
    plan = plan_from_pins(problem, pins, first=run.first_stage_blocks if run else None,
                          last=run.last_stage_blocks if run else None)
    return plan if cluster.cluster.is_homogeneous else on_groups_in_order(problem, plan)


def _settings(run: ImportedRun | None, seq_len, global_batch, precision, runtime, *,
              default_runtime: str = "megatron"):
    """Training settings: the caller's, else the imported configuration's, else defaults
    (``auto`` for solve: every runtime compared; megatron for estimate)."""
    seq_len = seq_len or (run.seq_len if run else None)
    global_batch = global_batch or (run.global_batch if run else None)
    if not seq_len or not global_batch:
        raise ConstraintError(
            "give --seq-len and --global-batch (the imported configuration does not state "
            "them).")
    return (seq_len, global_batch, precision or (run.precision if run else None) or "bf16",
            runtime or (run.runtime if run else default_runtime))


def estimate(model: ModelLike, cluster: ClusterLike,
             plan_or_pins: Plan | PinsLike | ImportedRun, *, seq_len: int | None = None,
             global_batch: int | None = None, mem_limit: MemLimit = None,
             precision: str | None = None, runtime: str | None = None,
             attention: str = "flash", profile: ProfileLike = None,
             runtime_settings: Mapping[str, Any] | None = None, optimizer: str | None = None,
             frozen_dtype: str | None = None, optimizer_in_backward: bool = False) -> Result:
    """Evaluate one plan: a Plan, pins completed with documented defaults, or an
    :class:`ImportedRun` read from a Megatron-LM, DeepSpeed or torchtitan configuration
    (``read_run(path)``), which may also supply the sequence length and global batch.
    ``profile`` replaces the compute profile as in :func:`solve`; ``runtime_settings`` fields
    of the runtime's profile (:func:`runtime_with`); ``optimizer``, ``frozen_dtype`` and
    ``optimizer_in_backward`` as in :func:`solve`."""
    start = time.perf_counter()
    model, cluster, profile = load_model(model), load_cluster(cluster), loaded_profile(profile)
    run = plan_or_pins if isinstance(plan_or_pins, ImportedRun) else None
    seq_len, global_batch, precision, runtime = _settings(run, seq_len, global_batch, precision,
                                                         runtime)
    training = training_spec(seq_len, global_batch, precision, runtime, attention, optimizer,
                         frozen_dtype, optimizer_in_backward)
    problem = make_problem(model, cluster, training, mem_limit, profile=profile,
                           runtime_settings=runtime_settings)
    plan = plan_for(problem, cluster, model, plan_or_pins)
    if optimizer_in_backward:
        require_no_accumulation(plan)
    est = estimate_plan(problem, plan)
    info = SolverInfo(status="ESTIMATE", objective=est.step_time_s, bound=est.step_time_s, gap=0.0,
                      wall_time_s=time.perf_counter() - start)
    return _result(problem, model, cluster, plan, est, info, profile)


def load_result(path: str | Path) -> Result:
    """Read back what ``autoplan solve --json`` printed."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "no such file"
        raise PlanFileError(f"{path}: {what}; save `autoplan solve --json` output there.")
    try:
        return Result.model_validate_json(path.read_bytes())
    except OSError as err:
        raise PlanFileError(f"{path}: cannot be read ({err.strerror}).") from None
    except ValidationError as err:
        raise PlanFileError(
            f"{path}: not a plan document from `autoplan solve --json` "
            f"({_first_problem(err)}).") from None


def _first_problem(err: ValidationError) -> str:
    """The first validation problem with where it is, e.g. ``plan.tp: Field required``, or the
    JSON parser's complaint with its line and column."""
    item = err.errors()[0]
    where = ".".join(str(p) for p in item["loc"])
    problems = f"; {err.error_count() - 1} more" if err.error_count() > 1 else ""
    return f"{where + ': ' if where else ''}{item['msg']}{problems}"


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
    from autoplan.costmodels.problem import Problem as _Problem
    from autoplan.verify.memory import FP32_ADAM, predicted_rank_bytes
    from autoplan.verify.runner import verify_plan
    from autoplan.verify.tp_check import local_tp_problem
    if isinstance(plan_or_result, (str, Path)):
        plan_or_result = load_result(plan_or_result)
    result = plan_or_result if isinstance(plan_or_result, Result) else None
    plan = result.plan if result else plan_or_result
    if seq_len is None:
        if result is None or (result.training is None and result.model is None):
            raise ConstraintError("verify needs seq_len for a bare Plan; pass seq_len=.")
        seq_len = result.training.seq_len if result.training else result.model.seq_len
    if not isinstance(model, (str, Path)):
        raise ConstraintError("verify needs the path of model.py: every rank imports it.")
    if plan.stage_groups is not None:
        raise ConstraintError(
            "verify runs a plan on one kind of CPU rank; this plan puts its stages on node "
            "groups of a heterogeneous cluster. Verify its layer split with `autoplan export "
            "--target torchrun` on the cluster, or solve for one group to verify here.")
    loaded = load_model(model, trace_time_limit_s=trace_time_limit_s or DEFAULT_TRACE_TIME_LIMIT_S)
    cluster = load_cluster(result.cluster if result and result.cluster else {
        "gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": plan.world_size,
        "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"}})
    training = TrainingSpec(seq_len=seq_len, global_batch=plan.global_batch_size,
                            attention=AttentionKernel.EXPLICIT)
    problem = _Problem(graph=loaded.trace(seq_len, "fp32"), cluster=cluster.cluster,
                       training=training, runtime=FP32_ADAM,
                       compute=compute_profile(cluster.cluster.gpu.name),
                       mem_limit_bytes=cluster.cluster.gpu.memory_bytes)
    notes = []
    if plan.tp > 1:
        problem_line = local_tp_problem(loaded.source, problem.graph, plan.tp)
        if problem_line:
            notes.append(problem_line)
    return verify_plan(str(model), plan, seq_len=seq_len, steps=steps,
                       predicted_bytes=predicted_rank_bytes(problem, plan), notes=notes)


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
    from autoplan.explain import explain_plan

    result = result if isinstance(result, Result) else load_result(result)
    if result.cluster is None or result.training is None:
        raise PlanFileError("the plan JSON lacks its cluster or training section; save the "
                            "output of `autoplan solve --json` and explain that.")
    t = result.training
    training = training_spec(t.seq_len, t.global_batch, t.precision, t.runtime, "flash",
                         t.optimizer, t.frozen_dtype, t.optimizer_in_backward)
    cluster = load_cluster(result.cluster)
    require_homogeneous(cluster.cluster, "explain")
    model = load_model(model)
    profile = loaded_profile(profile)
    problem = make_problem(model, cluster, training,
                           result.estimate.memory_limit_gib * 2**30, profile=profile)
    check_plan_matches(problem, result.plan, model, result.model)
    explanation = explain_plan(problem, result, _pins(pins))
    note = calibration_note(profile, problem, result.plan)
    if note is None or not note.warnings:
        return explanation
    return explanation.model_copy(update={"warnings": [*explanation.warnings, *note.warnings]})


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
    from autoplan import plots

    check_writable_folder(Path(folder), flag="--plots")
    if not force:
        refuse_existing([Path(folder) / f"{name}.png" for name in plots.PLAN_FIGURES])
    with write_errors_as(OutputExistsError, "--plots"):
        return plots.plan_figures(result, folder)


def calibrate(out: str | Path, *, device: str | None = None, quick: bool = False
              ) -> tuple[MeasuredProfile, ComputeProfile]:
    """Measure this machine (GEMMs, memory copy, all-reduce with several GPUs), write the
    profile YAML to ``out`` and return it with the compute profile fitted from it.
    ``device`` None: cuda when a GPU is visible, else cpu."""
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConstraintError(f"--device {device!r}: use cpu or cuda.")
    measured = measure(device, quick=quick)
    write_profile(measured, out)
    return measured, fitted_profile(measured)


def draw_topology(cluster: LoadedCluster, path: str | Path, *, force: bool = False) -> Path:
    """A PNG of the cluster's topology at ``path``, written atomically.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is false.
    """
    from autoplan.cluster.render import draw_png

    path = Path(path)
    if path.is_dir():
        raise OutputExistsError(f"--png {path} is a folder; give the path of the PNG file to write.")
    check_writable_folder(path.parent, flag="--png")
    if not force:
        refuse_existing([path])
    with write_errors_as(OutputExistsError, "--png"):
        return draw_png(cluster.cluster, path)


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
    from autoplan.fit import fit
    from autoplan.run_profile import profile_from_fit, write_runs_profile
    from autoplan.runs import read_runs

    if not force:
        refuse_existing([Path(out)])
    measured = [run for source in runs for run in read_runs(source, model=model, cluster=cluster)]
    prepared = fit_runs(measured)
    profile = profile_from_fit(prepared, fit(prepared, leave_one_out=leave_one_out))
    write_runs_profile(profile, out)
    return profile.model_copy(update={"source": str(out)})


def fit_runs(measured: list) -> list:
    """Each measured run traced and planned (autoplan.fit.FitRun), all on one GPU and runtime.

    Raises:
        RunsError: naming the run (row) and the column at fault.
    """
    from autoplan.fit import FitRun
    from autoplan.runs import RunsError

    models: dict[Path, Model] = {}
    clusters: dict[Path, LoadedCluster] = {}
    out = []
    for run in measured:
        try:
            cluster = clusters.get(run.cluster) or clusters.setdefault(
                run.cluster, load_cluster(run.cluster))
        except AutoplanError as err:
            raise RunsError(f"{run.label}, column cluster: {err}") from None
        world = math.prod(run.pins.get(k, 1) for k in ("tp", "pp", "dp", "cp"))
        if "dp" in run.pins and world > cluster.cluster.num_gpus:
            raise RunsError(
                f"{run.label}, columns tp,pp,dp,cp: tp*pp*dp*cp = {world} GPUs but "
                f"{run.cluster.name} has {cluster.cluster.num_gpus}; give the cluster the run "
                "used or the degrees it ran with.")
        model = models.setdefault(run.model, load_model(run.model))
        training = training_spec(run.seq_len, run.global_batch, run.precision or "bf16",
                             run.runtime, "flash")
        try:
            problem = make_problem(model, cluster, training)
        except AutoplanError as err:
            raise RunsError(f"{run.label}, column model: {run.model} does not trace: {err}") from None
        try:
            plan = plan_for(problem, cluster, model, run.pins)
        except AutoplanError as err:
            raise RunsError(f"{run.label}, columns tp,pp,dp,cp,mbs: {err}") from None
        tokens = run.tokens_per_s_per_gpu or (
            run.global_batch * run.seq_len / (run.step_time_s * plan.world_size))
        out.append(FitRun(run.label, problem, plan, tokens, run.peak_memory_gib))
    _same_hardware_and_runtime(out)
    return out


def _same_hardware_and_runtime(runs: list) -> None:
    """A calibration is of one runtime on one GPU: refuse runs that mix them."""
    from autoplan.runs import RunsError

    first = runs[0]
    for run in runs[1:]:
        for column, value, reference in (
                ("cluster", run.problem.cluster.gpu.name, first.problem.cluster.gpu.name),
                ("runtime", run.problem.training.runtime.value,
                 first.problem.training.runtime.value)):
            if value != reference:
                raise RunsError(
                    f"{run.label}, column {column}: {value}, but {first.label} has {reference}. "
                    "A calibration fits one runtime on one GPU; calibrate each separately.")
