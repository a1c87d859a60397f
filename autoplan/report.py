"""A Result: built from a solved or estimated plan, read back from ``solve --json``, and
rendered for the terminal (rich tables)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from autoplan.calibrate import bus_bandwidth_Bps
from autoplan.capabilities import RUNTIMES
from autoplan.cluster.spec import load_cluster_spec, resolve
from autoplan.costmodels.comm import network_note, slow_link_note
from autoplan.costmodels.ranks import userbuffers_allocated
from autoplan.costmodels.tp_overlap import cfg_mapping
from autoplan.degrees import DEGREE
from autoplan.errors import PlanFileError
from autoplan.graph.layer_graph import LayerGraph
from autoplan.plan import (
    CalibrationNote, Estimate, LoraInfo, ModelInfo, Plan, Result, SolverInfo, TrainingInfo,
    degrees,
)
from autoplan.run_profile import RunsProfile
from autoplan.plugins.summary import fine_tuning_line
from autoplan.training import Runtime
from autoplan.units import format_count, format_flops, format_seconds

if TYPE_CHECKING:
    from autoplan.calibrate import MeasuredProfile
    from autoplan.cluster.loaded import LoadedCluster
    from autoplan.costmodels.profiles import ComputeProfile
    from autoplan.inference import InferencePlacement
    from autoplan.costmodels.problem import Problem
    from autoplan.graph.model import Model
    from autoplan.problems import Profile

MODEL_DIMS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
              "vocab_size", "gated_mlp", "rmsnorm", "rotary", "tied_embeddings", "linear_bias",
              "rope_theta", "rope_scaling_type", "rope_scaling_factor", "norm_eps")
"""The traced model's dims the plan JSON carries (for exporters and for the checks that a
saved plan belongs to a model)."""


def build_result(problem: Problem, model: Model, cluster: LoadedCluster, plan: Plan,
                 est: Estimate, info: SolverInfo, profile: Profile | None = None) -> Result:
    """The document ``solve --json`` prints: the plan with its estimate, how it was found,
    and the model, cluster, training settings and calibration it was made for."""
    graph, dims = problem.graph, problem.graph.dims
    model_info = ModelInfo(
        name=model.name, num_params=graph.num_params,
        num_trainable_params=graph.num_trainable_params, seq_len=graph.seq_len,
        layer_kinds=tuple(l.kind.value for l in graph.layers),
        **({k: getattr(dims, k) for k in MODEL_DIMS} if dims else {}),
        **moe_info(graph),
        **({"lora": LoraInfo(**dataclasses.asdict(graph.lora))} if graph.lora else {}),
    )
    training = TrainingInfo(seq_len=problem.training.seq_len,
                            global_batch=problem.training.global_batch,
                            precision=problem.training.precision.value,
                            runtime=problem.training.runtime.value,
                            optimizer=problem.training.optimizer.value,
                            frozen_dtype=problem.training.frozen_storage.value,
                            optimizer_in_backward=problem.training.optimizer_in_backward,
                            torch_compile=problem.runtime.compile,
                            transformer_impl=problem.runtime.transformer_impl,
                            grad_reduce_in_bf16=problem.runtime.grad_reduce_in_bf16,
                            **_tp_overlap_info(problem, plan))
    return Result(plan=plan, estimate=est, solver=info, model=model_info, cluster=cluster.spec,
                  training=training, calibration=calibration_note(profile, problem, plan))


def _tp_overlap_info(problem: Problem, plan: Plan) -> dict:
    """The TrainingInfo fields of the TP overlap, where the plan was priced with it."""
    if not userbuffers_allocated(problem, plan):
        return {}
    return {"tp_comm_overlap": True,
            "tp_comm_overlap_cfg": cfg_mapping(problem.runtime.tp_comm_overlap_cfg)}


def moe_info(graph: LayerGraph) -> dict:
    """Experts per MoE layer and experts per token, for exporters; empty for a dense model."""
    moe = [e for layer in graph.layers for e in layer.experts]
    return {"num_experts": moe[0].num_experts, "moe_top_k": moe[0].top_k} if moe else {}


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


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def _stage_counts(result: Result, stages) -> list[str]:
    """Blocks (layers when the model is unknown) of each stage."""
    kinds = result.model.layer_kinds if result.model else ()
    counts = []
    for stage in stages:
        span = kinds[stage.first_layer: stage.first_layer + stage.num_layers]
        blocks = sum(1 for k in span if k == "block")
        counts.append(str(blocks) if kinds else str(stage.num_layers))
    return counts


def _unit(result: Result) -> str:
    return "blocks" if result.model else "layers"


def _stages_text(result: Result) -> str:
    counts = _stage_counts(result, result.plan.stages)
    return f"{' / '.join(counts)} {_unit(result)} per stage (pipeline order)"


def _group_rows(result: Result) -> list[tuple[str, str]]:
    """One row per node group running stages: which stages, how many blocks each."""
    stages, rows = result.plan.stages, []
    runs: dict[str, list[int]] = {}
    for index, stage in enumerate(stages):
        runs.setdefault(stage.group, []).append(index)
    for group, indices in runs.items():
        counts = _stage_counts(result, [stages[i] for i in indices])
        span = (f"stage {indices[0]}" if len(indices) == 1
                else f"stages {indices[0]}-{indices[-1]}")
        rows.append((f"  on {group}", f"{span}: {' / '.join(counts)} {_unit(result)}"))
    return rows


def _cluster_gpus(result: Result) -> int | None:
    cluster = result.cluster or {}
    if "nodes" in cluster and "gpus_per_node" in cluster:
        return cluster["nodes"] * cluster["gpus_per_node"]
    if "groups" in cluster:
        return sum(g.get("nodes", 0) * g.get("gpus_per_node", 0) for g in cluster["groups"])
    return None


def plan_table(result: Result) -> Table:
    p = result.plan
    total = _cluster_gpus(result)
    of_total = f" of {total}" if total and total != p.world_size else ""
    return _kv_table("Plan", [
        ("parallelism", f"{degrees(p)} = {p.world_size}{of_total} GPUs"),
        ("micro-batch", f"{p.micro_batch_size} x {p.num_microbatches} micro-batches "
         f"(global batch {p.global_batch_size})"),
        ("ZeRO stage", str(p.zero_stage)),
        ("recompute", p.recompute.value if p.recompute_num_layers is None else
         f"full, first {p.recompute_num_layers} blocks of each chunk"),
        ("sequence parallel", "yes" if p.sequence_parallel else "no"),
        ("interleaved stages", f"{p.vpp} chunks per rank" if p.vpp > 1 else "no (1F1B)"),
        ("offload", p.offload.value),
        ("rank placement", f"{p.placement} (innermost first)"),
        *([("expert parallel", f"{p.ep} ranks (experts split within dp*cp)")] if p.ep > 1 else []),
        ("layers", _stages_text(result)),
        *(_group_rows(result) if p.stage_groups else []),
    ])


def estimate_table(result: Result) -> Table:
    e = result.estimate
    left = e.memory_limit_gib - e.peak_memory_gib
    status = (f"fits, {left:.1f} GiB left" if e.feasible
              else f"DOES NOT FIT, {-left:.1f} GiB over")
    reserved = ([("allocator reserved", f"{e.peak_reserved_gib:.1f} GiB (the rest of the peak: "
                  "CUDA context and NCCL buffers)")] if e.peak_reserved_gib is not None else [])
    return _kv_table("Predicted", [
        ("step time", format_seconds(e.step_time_s)),
        ("throughput", f"{e.tokens_per_s:,.0f} tokens/s"),
        ("per GPU", f"{e.model_tflops_per_gpu:.1f} model TFLOP/s, "
         f"{e.hardware_tflops_per_gpu:.1f} hardware TFLOP/s, MFU {e.mfu:.1%}"),
        ("peak memory", f"{e.peak_memory_gib:.1f} GiB of {e.memory_limit_gib:.1f} GiB ({status})"
         + (f", on stage {_tightest(e)} (each stage against its group's GPU)"
            if e.stage_memory_limit_gib else "")),
        *reserved,
    ])


def _tightest(e) -> int:
    """The stage whose memory and limit the Estimate reports."""
    return next((i for i, (m, l) in enumerate(zip(e.stage_memory_gib, e.stage_memory_limit_gib))
                if m == e.peak_memory_gib and l == e.memory_limit_gib), 0)


def _breakdown_table(title: str, values: dict[str, float], unit: str, total: float) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("part")
    table.add_column("time" if unit == "s" else unit, justify="right")
    table.add_column("share", justify="right")
    for name, value in values.items():
        share = value / total if total else 0.0
        table.add_row(name.replace("_", " "), format_seconds(value) if unit == "s" else f"{value:.2f}",
                      f"{share:.0%}")
    return table


def _slow_link(result: Result) -> str | None:
    if not result.cluster:
        return None
    return slow_link_note(resolve(load_cluster_spec(result.cluster)), result.plan.world_size)


def solver_text(result: Result) -> Text:
    s = result.solver
    goal = "" if s.objective_terms == ("time",) else (
        f" for {' then '.join(s.objective_terms)}: {s.objective:.4g} {s.objective_unit}")
    if s.status == "OPTIMAL":
        line = f"Solver: OPTIMAL (proven){goal} in {format_seconds(s.wall_time_s)}"
    elif s.status == "ESTIMATE":
        line = f"Estimate of the given plan (no search) in {format_seconds(s.wall_time_s)}"
    else:
        unit = s.objective_unit
        line = (f"Solver: {s.status}: best found {s.objective:.4g} {unit}, bound "
                f"{s.bound:.4g} {unit}, gap {s.gap:.1%} after {format_seconds(s.wall_time_s)}")
    return Text(line, style="bold green" if s.status == "OPTIMAL" else "bold yellow")


def render(result: Result, console: Console) -> None:
    """Print the full report."""
    e = result.estimate
    title = f"autoplan: {result.model.name if result.model else 'model'}"
    if result.model:
        title += f" ({format_count(result.model.num_params)} parameters)"
    console.print(Text(title, style="bold"))
    if (line := fine_tuning_line(result)) is not None:
        console.print(line)
    console.print(Group(
        plan_table(result), "", estimate_table(result), "",
        _breakdown_table("Memory per GPU (worst stage)", e.memory_breakdown_gib, "GiB",
                         e.peak_memory_gib),
        _breakdown_table("Step time", e.time_breakdown_s, "s", e.step_time_s),
        *([Text(note, style="yellow")] if (note := network_note(e)) else []),
        *([Text(note, style="yellow")] if (note := _slow_link(result)) else []),
        solver_text(result),
        *([runners_up_table(result)] if result.runners_up else []),
        *([frameworks_table(result), Text(recommendation(result), style="bold")]
          if result.runtimes and len(result.runtimes) > 1 else []),
        *calibration_lines(result),
    ))


def model_code(runtime: str, plan: Plan) -> str:
    """What the model code needs for this plan on this runtime: TP and PP need Megatron-style
    modules (or a TP plan and a stage split), ZeRO and FSDP wrap the model as it is."""
    split = plan.tp > 1 or plan.pp > 1 or plan.cp > 1 or plan.ep > 1
    if runtime == Runtime.MEGATRON.value:
        return "Megatron-LM modules"
    if runtime == Runtime.DEEPSPEED.value and plan.pp > 1:
        return "Megatron-DeepSpeed modules"
    if runtime == Runtime.DEEPSPEED.value:
        return "none (AutoTP)" if split else "none"
    return "torchtitan TP/PP plan" if split else "none"


def _plan_words(plan: Plan) -> str:
    words = f"TP{plan.tp} PP{plan.pp} DP{plan.dp} ZeRO-{plan.zero_stage}"
    words += f" CP{plan.cp}" if plan.cp > 1 else ""
    words += f" VPP{plan.vpp}" if plan.vpp > 1 else ""
    words += f" {plan.recompute.value} recompute" if plan.recompute.value != "none" else ""
    return words + (f" offload {plan.offload.value}" if plan.offload.value != "none" else "")


def frameworks_table(result: Result) -> Table:
    """The best plan of each runtime (and its ZeRO-2 and ZeRO-3 plans where both fit)."""
    table = Table(title="Best plan per framework", title_justify="left")
    for column in ("framework", "step", "vs chosen", "peak GiB", "GPUs", "plan",
                   "model code"):
        table.add_column(column, justify="left" if column in ("framework", "plan", "model code")
                         else "right")
    base = result.estimate.step_time_s
    rows = [(o.runtime, "", o.plan, o.step_time_s, o.peak_memory_gib, o.reason)
            for o in result.runtimes]
    rows += [(z.runtime, f" ZeRO-{z.zero_stage}", z.plan, z.step_time_s, z.peak_memory_gib, None)
             for z in result.zero_options or () if z.plan != _best_plan(result, z.runtime)]
    for runtime, variant, plan, step, peak, reason in rows:
        name = RUNTIMES[Runtime(runtime)].name + variant
        if plan is None:
            table.add_row(name, "-", "-", "-", "-", f"no plan: {reason}", "-")
            continue
        table.add_row(name, format_seconds(step), f"{step / base - 1:+.1%}", f"{peak:.1f}",
                      str(plan.world_size), _plan_words(plan), model_code(runtime, plan))
    return table


def _best_plan(result: Result, runtime: str) -> Plan | None:
    return next((o.plan for o in result.runtimes if o.runtime == runtime), None)


SIMPLER_WITHIN = 0.05
"""A plan that needs no model changes is worth naming when it is this close to the fastest."""


def recommendation(result: Result) -> str:
    """One line: which framework to use and why (fastest, by how much; a plan without model
    changes when one is within SIMPLER_WITHIN)."""
    chosen = result.training.runtime
    base = result.estimate.step_time_s
    others = sorted((o for o in result.runtimes if o.plan is not None and o.runtime != chosen),
                    key=lambda o: o.step_time_s)
    name = RUNTIMES[Runtime(chosen)].name
    if not others:
        return f"Use {name}: it is the only framework with a plan here."
    line = (f"Use {name}: {others[0].step_time_s / base - 1:.1%} faster per step than "
            f"{RUNTIMES[Runtime(others[0].runtime)].name}, the next best")
    if model_code(chosen, result.plan).startswith("none"):
        return line + ", and it needs no model changes."
    simple = [o for o in others if model_code(o.runtime, o.plan).startswith("none")
              and o.step_time_s <= base * (1 + SIMPLER_WITHIN)]
    if simple:
        line += (f"; {RUNTIMES[Runtime(simple[0].runtime)].name} "
                 f"({_plan_words(simple[0].plan)}) is within "
                 f"{simple[0].step_time_s / base - 1:.1%} and needs no model changes")
    return line + "."


def calibration_lines(result: Result) -> list[Text]:
    """The ``--profile`` fitted to runs, and one warning line for each reason it may not hold."""
    note = result.calibration
    if note is None:
        return []
    fitted = ", ".join(f"{k} {v:.3g}" for k, v in note.parameters.items()) or "nothing fitted"
    lines = [Text(f"calibrated with {note.profile}: {fitted}")]
    return lines + [Text(f"warning: {w}", style="bold yellow") for w in note.warnings]


def render_calibration(profile: RunsProfile, console: Console) -> None:
    """The fit of ``calibrate --runs``: per run measured / before / after / left out, the
    fitted and fixed parameters, and the mean errors."""
    table = Table(title=f"calibration on {profile.fitted_on.runs} run(s) "
                        f"({profile.fitted_on.gpu}, {profile.fitted_on.runtime})",
                  title_justify="left")
    for column in ("run", "tok/s/GPU", "before", "after", "left out", "GiB", "before", "after"):
        table.add_column(column, justify="left" if column == "run" else "right",
                         no_wrap=column == "run")
    for row in profile.runs:
        measured, before, after, loro = row.tokens_per_s_per_gpu
        memory = row.peak_memory_gib or (None, None, None, None)
        table.add_row(row.run, f"{measured:,.0f}", f"{before:,.0f}", f"{after:,.0f}",
                      "-" if loro is None else f"{loro:,.0f}",
                      *("-" if m is None else f"{m:.1f}" for m in memory[:3]))
    console.print(table)
    for name, value in profile.parameters.items():
        console.print(f"fitted {name}: {profile.catalog.get(name, float('nan')):.4g} -> {value:.4g}")
    for name, reason in profile.fixed.items():
        console.print(f"fixed {name}: {reason}", highlight=False)
    fit = profile.fit
    loro = "-" if fit.loro_mean_abs_error is None else f"{fit.loro_mean_abs_error:.1%}"
    console.print(f"tokens/s/GPU mean error: {fit.mean_abs_error_before:.1%} before, "
                  f"{fit.mean_abs_error_after:.1%} after; leave-one-run-out {loro}")
    if fit.memory_mean_abs_error_before is not None:
        console.print(f"peak memory mean error: {fit.memory_mean_abs_error_before:.1%} before, "
                      f"{fit.memory_mean_abs_error_after:.1%} after; memory margin "
                      f"{profile.memory_margin:.1%} (plans must fit with their peak that much "
                      "larger)")


def runners_up_table(result: Result, count: int = 6) -> Table:
    """The best plan of each other (TP, PP) shape and how much slower it is."""
    table = Table(title="Runners-up (best plan of each other TP x PP shape)",
                  title_justify="left")
    for column in ("plan", "step", "slower"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    for u in result.runners_up[:count]:
        table.add_row(u.plan or f"TP{u.tp} x PP{u.pp} x DP{u.dp}", format_seconds(u.step_time_s),
                      f"{u.slower_by:+.1%}")
    return table


def render_trace(document: dict, console: Console) -> None:
    """Print the layer table of ``autoplan trace``."""
    table = Table(title=f"{document['model']}: seq {document['seq_len']}, batch {document['batch']}",
                  title_justify="left")
    for column in ("layer", "kind", "params", "fwd FLOP", "bwd FLOP", "act MiB", "boundary MiB",
                   "TP split"):
        table.add_column(column, justify="left" if column in ("layer", "kind", "TP split") else "right")
    for layer in document["layers"]:
        splits = {}
        for split in layer["tp_split"].values():
            splits[split] = splits.get(split, 0) + 1
        table.add_row(
            layer["name"], layer["kind"], f"{layer['params']:,}", format_flops(layer["fwd_flops"]),
            format_flops(layer["bwd_flops"]), f"{layer['activation_bytes'] / 2**20:.1f}",
            f"{layer['boundary_bytes'] / 2**20:.1f}",
            ", ".join(f"{n} {s}" for s, n in splits.items()) or "-")
    console.print(table)
    trainable = document.get("num_trainable_params", document["num_params"])
    frozen = f" ({trainable:,} trainable)" if trainable != document["num_params"] else ""
    console.print(f"total: {document['num_params']:,} parameters{frozen}, "
                  f"{format_flops(document['fwd_flops'])} forward, "
                  f"{format_flops(document['bwd_flops'])} backward")


_COMPARED = ("tp", "pp", "dp", "mbs", "zero", "recompute", "sp", "vpp", "offload")
"""The degrees a current setup is compared on, by pin name."""


def changes(current: Result, best: Result) -> list[str]:
    """What to change in the current setup to run the plan, one phrase per setting."""
    phrases = []
    for name in _COMPARED:
        field = DEGREE[name].plan
        old, new = getattr(current.plan, field), getattr(best.plan, field)
        if old != new:
            phrases.append(f"{DEGREE[name].label} {getattr(old, 'value', old)} -> {getattr(new, 'value', new)}")
    return phrases


def render_comparison(current: Result, best: Result, console: Console) -> None:
    """Print the current setup (from --from) against the optimum."""
    now, opt = current.estimate, best.estimate
    fits = "fits" if now.feasible else "DOES NOT FIT"
    console.print(Text("Your current setup", style="bold"))
    console.print(f"{format_seconds(now.step_time_s)} per step, {now.tokens_per_s:,.0f} tokens/s, peak memory "
                  f"{now.peak_memory_gib:.1f} GiB of {now.memory_limit_gib:.1f} ({fits}).")
    todo = changes(current, best)
    if not todo:
        console.print("It is the optimum.")
        return
    console.print(f"The plan above is {now.step_time_s / opt.step_time_s:.2f}x as fast; change "
                  + ", ".join(todo) + ".")


def trace_document(graph: LayerGraph, batch: int = 1) -> dict:
    """The ``autoplan trace --json`` document for ``batch`` sequences (figures per sample in the
    graph scale linearly with the batch)."""
    layers = [{
        "name": l.name, "kind": l.kind.value, "params": l.num_params,
        "trainable_params": l.trainable_params,
        "fwd_flops": l.fwd_flops * batch, "bwd_flops": l.bwd_flops * batch,
        "activation_bytes": l.activation_bytes * batch + l.attention_internal_bytes * batch,
        "boundary_bytes": l.boundary_bytes * batch,
        "tp_split": {g.name: g.split.value for g in l.gemms},
    } for l in graph.layers]
    return {"model": graph.name, "seq_len": graph.seq_len, "batch": batch,
            "num_params": graph.num_params, "num_trainable_params": graph.num_trainable_params, "fwd_flops": graph.fwd_flops * batch,
            "bwd_flops": graph.bwd_flops * batch, "layers": layers,
            "tp_constraints": tp_constraints(graph)}


VOCAB_PAD_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by)."""


def tp_constraints(graph: LayerGraph) -> dict:
    """What a TP degree must respect: it divides the attention heads and KV heads; the
    vocabulary is padded to a multiple of 128 x tp (the padded size per TP degree is listed)."""
    vocab = graph.dims.vocab_size if graph.dims else 0
    multiple = VOCAB_PAD_MULTIPLE
    return {"divides": list(graph.tp_divisors),
            "vocab_size": vocab,
            "padded_vocab": {tp: -(-vocab // (multiple * tp)) * multiple * tp
                             for tp in (1, 2, 4, 8) if vocab}}


def render_verify(document: dict, console: Console) -> None:
    """``autoplan verify``: each step's losses, the largest difference, each rank's peak
    memory measured against predicted, and the runner's notes."""
    for step, (ref, par) in enumerate(zip(document["losses_reference"],
                                          document["losses_parallel"])):
        console.print(f"step {step}: reference {ref:.6f}  parallel {par:.6f}")
    console.print(f"largest relative loss difference: {document['max_rel_loss_diff']:.2e}")
    for rank in document["ranks"]:
        console.print(f"rank {rank['rank']}: peak {rank['peak_bytes_measured'] / 2**20:.2f} MiB "
                      f"measured, {rank['peak_bytes_predicted'] / 2**20:.2f} MiB predicted, "
                      f"{rank['peak_reserved_bytes_replayed'] / 2**20:.2f} MiB as CUDA's caching "
                      "allocator would reserve it")
    for note in document["notes"]:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)


def render_inference(placement: InferencePlacement, context_len: int, batch: int,
                     console: Console) -> None:
    """``autoplan infer``: the device_map as modules per GPU with memory, and the time per
    generated token."""
    modules: dict[int, list[str]] = {}
    for name, gpu in placement.device_map.items():
        modules.setdefault(gpu, []).append(name)
    table = Table(title=f"device_map over {placement.gpus_used} GPU(s), {context_len} tokens of "
                  f"context x batch {batch}", title_justify="left")
    for column in ("GPU", "modules", "first", "last", "GiB", "limit GiB"):
        table.add_column(column, justify="left" if column in ("first", "last") else "right")
    for gpu, names in sorted(modules.items()):
        table.add_row(str(gpu), str(len(names)), names[0], names[-1],
                      f"{placement.memory_per_gpu_gib[gpu]:.1f}",
                      f"{placement.memory_limit_gib:.1f}")
    console.print(table)
    console.print(f"time per generated token: {placement.time_per_token_s * 1e3:.1f} ms; "
                  f"{placement.tokens_per_s:,.1f} tokens/s (batch {batch})")


def render_measured(measured: MeasuredProfile, fitted: ComputeProfile, console: Console) -> None:
    """``autoplan calibrate``: what was measured here and the efficiencies fitted from it."""
    console.print(f"{measured.device_name} ({measured.dtype}), reference peak "
                  f"{measured.peak_flops / 1e12:.3g} TFLOP/s: gemm_efficiency "
                  f"{fitted.gemm_efficiency:.3f}, gemm_half_flops {fitted.gemm_half_flops:.3g}, "
                  f"memory_efficiency {fitted.memory_efficiency:.3f} "
                  f"({measured.memory.bytes / measured.memory.seconds / 1e9:.3g} GB/s)")
    if measured.all_reduce is not None:
        console.print(f"all-reduce over {measured.all_reduce.num_gpus} GPUs: bus bandwidth "
                      f"{bus_bandwidth_Bps(measured.all_reduce) / 1e9:.3g} GB/s")
