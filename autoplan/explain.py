"""Why this plan: the binding constraint, the runners-up, what-ifs and a practitioner's warnings.

Everything here reads the solver's own tables (``search.table.Table``) for the same problem,
so "the runner-up is 12% slower" is a statement about the same cost model and the same order
that picked the plan, and an explanation costs a few solves, not an enumeration:
runners-up are the solver's exact best plan per other (TP, PP) shape; what binds is read from
a table without the memory limit holding every candidate faster than the plan (pruning stops
only above the plan's step time); what-ifs solve the changed problem.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict

from autoplan.capabilities import RUNTIMES
from autoplan.cluster.loaded import load_cluster
from autoplan.cluster.spec import require_homogeneous
from autoplan.cluster.topology import GroupLinks
from autoplan.costmodels.comm import SLOW_NETWORK_BPS
from autoplan.costmodels.problem import Problem, limit_mib, memory_mib
from autoplan.costmodels.placement import axis_links
from autoplan.costmodels.step import estimate, peak_moments
from autoplan.errors import PlanFileError
from autoplan.graph.layer_graph import LayerGraph
from autoplan.graph.model import Model, load_model
from autoplan.options import as_pins
from autoplan.plan import Offload, OmitsDefaults, Plan, Result, one_line
from autoplan.plugins.colossalai_tp import compare_tp_modes
from autoplan.problems import Profile, loaded_profile, make_problem, training_spec
from autoplan.report import calibration_note
from autoplan.search.defaults import check_plan_matches
from autoplan.search.runners_up import best_by_shape
from autoplan.search.table import Table
from autoplan.training import Optimizer, Pins, Runtime
from autoplan.units import format_excess, format_seconds, gib_digits

if TYPE_CHECKING:
    from rich.console import Console

POOR_SCALING = 0.7
"""Per-GPU throughput under 70% of one node's: a healthy run scales close to linearly."""
LOW_HEADROOM = 0.05
"""Within 5% of the limit a plan's memory is shown with what is left to spare."""
ZERO3_TRAFFIC = 3
"""ZeRO-3 moves parameter bytes three times per step: all-gather forward, all-gather backward,
reduce-scatter gradients (Rajbhandari et al. 2020, sec. 7.2.2)."""
PARAM_BYTES = 2  # bf16/fp16 weights and gradients on the wire


class RunnerUp(BaseModel):
    """The best plan of one (TP, PP) shape other than the chosen one."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tp: int
    pp: int
    plan: str
    step_time_s: float
    slower_by: float  # fraction of the chosen plan's step time
    peak_memory_gib: float
    fits: bool


class WhatIf(BaseModel):
    """The answer under a changed input."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    change: str
    plan: str | None
    step_time_s: float | None
    speedup: float | None  # chosen step time / new step time - 1
    plan_changes: bool


class TpMode(BaseModel):
    """TP traffic of one Colossal-AI mode next to 1D (see :mod:`autoplan.plugins.colossalai_tp`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mode: str
    gpus: int
    shape: str
    bytes_per_layer_per_gpu: float
    vs_1d: float


class Explanation(OmitsDefaults):
    """``autoplan explain --json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    plan: str
    step_time_s: float
    binding: str
    bottleneck: str
    runners_up: list[RunnerUp]
    what_ifs: list[WhatIf]
    warnings: list[str]
    tp_modes: list[TpMode] = []  # 1D vs 2D/2.5D/3D TP near the plan's TP size
    fine_tuning: str | None = None
    """What fine-tuning saved against training every parameter with AdamW (None, and left out
    of the JSON, for a full training with AdamW)."""

    frameworks: list[str] = []  # how far behind the chosen plan each other runtime's best is

    _omitted_defaults: ClassVar[dict[str, object]] = {"fine_tuning": None}


UNLIMITED_BYTES = float(2**62)
"""A memory limit nothing reaches: the table of what would be fastest if memory were free."""


def _key(plan: Plan) -> tuple:
    return tuple(sorted(plan.model_dump(mode="json", exclude={"stages"}).items())) + (plan.stages,)


def best_row(table: Table) -> int | None:
    """The solver's choice in ``table``: eligible, smallest under its order."""
    rows = table.eligible()
    return min(rows, key=table.order) if rows else None


def _row_of(table: Table, plan: Plan) -> int:
    """The row of ``plan`` in ``table``, evaluated into it if the search never did (a pinned
    or estimated plan)."""
    mine = _key(plan)
    row = next((r for r, p in enumerate(table.plans) if _key(p) == mine), None)
    if row is None:
        table.add(plan)
        row = len(table) - 1
    return row


def _describe_links(problem: Problem, links: GroupLinks) -> str:
    cluster = problem.cluster
    if links.crosses_nodes:
        return (f"the inter-node {cluster.inter.name} network across {links.num_nodes} nodes "
                f"({links.nic_bandwidth_per_gpu * 8 / 1e9:.0f} Gb/s per GPU)")
    return f"the intra-node {cluster.intra.name} link ({links.intra_bandwidth / 1e9:.0f} GB/s per GPU)"


def binding(table: Table, problem: Problem, row: int, pins: Pins) -> str:
    """What keeps the plan from being faster: its own memory when it does not fit; the pins
    (or whoever chose it) when a faster plan fits; memory when the faster candidates of the
    solver's order all overflow (say which stage of the nearest miss); else nothing."""
    est = table.estimate(row)
    worst = max(range(len(est.stage_memory_gib)), key=lambda s: est.stage_memory_gib[s])
    own = (f"the plan's fullest GPU is on pipeline stage {worst} at "
           f"{_against_limit(est.peak_memory_gib, est.memory_limit_gib)}, its peak during "
           f"{peak_moments(problem, table.plans[row])[worst]}")
    best = best_row(table)
    if not table.fits(row):
        other = (_faster_fit(table, best, row) if best is not None
                 else "no plan fits under these pins")
        return f"memory: the plan does not fit: {own}; {other}."
    if best is not None and table.key(best) < table.key(row):
        return (f"pins: {_faster_fit(table, best, row)}, so what binds is the choice of this "
                f"plan (pinned or estimated), not memory; {own}.")
    free = Table.build(replace(problem, mem_limit_bytes=UNLIMITED_BYTES), pins,
                       bound_key=table.key(row))
    fastest = min(range(len(free)), key=free.order)
    if free.key(fastest) >= table.key(row):
        return f"nothing binds: the plan is the fastest candidate even ignoring memory; {own}."
    limit = limit_mib(problem)
    fest = free.estimate(fastest)
    faster = [r for r in range(len(free)) if free.key(r) < table.key(row)
              and memory_mib(free.peak_bytes[r]) > limit]  # all of them: the plan is the best fit
    nearest = min(faster, key=lambda r: (free.peak_bytes[r], free.order(r)))
    nest = free.estimate(nearest)
    stage = max(range(len(nest.stage_memory_gib)), key=lambda s: nest.stage_memory_gib[s])
    limit_gib = problem.mem_limit_bytes / 2**30
    return (f"memory: {len(faster)} faster candidates do not fit (the fastest, "
            f"{one_line(free.plans[fastest])}, {1 - fest.step_time_s / est.step_time_s:.1%} "
            f"faster, needs {fest.peak_memory_gib:.0f} GiB); the nearest miss, "
            f"{one_line(free.plans[nearest])}, would take {format_seconds(nest.step_time_s)} "
            f"({1 - nest.step_time_s / est.step_time_s:.1%} faster) but needs "
            f"{need_against_limit(nest.peak_memory_gib, limit_gib)} on pipeline stage {stage}; "
            f"{own}.")


def _faster_fit(table: Table, best: int, row: int) -> str:
    """The solver's choice ``best`` against ``row``, as a clause."""
    best_s, row_s = table.step_times_s[best], table.step_times_s[row]
    relation = (f"{1 - best_s / row_s:.1%} less than this plan's {format_seconds(row_s)}"
                if best_s <= row_s else
                f"{best_s / row_s - 1:.1%} more than this plan's {format_seconds(row_s)}")
    return (f"the fastest plan that fits, {one_line(table.plans[best])}, needs "
            f"{table.peak_bytes[best] / 2**30:.1f} GiB and takes {format_seconds(best_s)}, "
            f"{relation}")


def need_against_limit(need_gib: float, limit_gib: float) -> str:
    """``81.3 GiB (limit 80.0 GiB)`` with as many decimals as it takes for the two to differ,
    and under a GiB over the excess in MiB."""
    need = f"{need_gib:.{gib_digits(need_gib, limit_gib)}f} GiB (limit {limit_gib:.1f} GiB"
    if need_gib - limit_gib >= 1:
        return need + ")"
    return f"{need}, {format_excess(need_gib, limit_gib)} over)"


def _against_limit(used_gib: float, limit_gib: float) -> str:
    """``43.7 of 76.0 GiB``; within LOW_HEADROOM of the limit with the digits that differ and
    what is left (``79.96 of 80.0 GiB, 41 MiB to spare``), over it by how much."""
    if used_gib > limit_gib:
        return (f"{used_gib:.{gib_digits(used_gib, limit_gib)}f} of {limit_gib:.1f} GiB, "
                f"{format_excess(used_gib, limit_gib)} over the limit")
    if used_gib < limit_gib * (1 - LOW_HEADROOM):
        return f"{used_gib:.1f} of {limit_gib:.1f} GiB"
    spare_mib = (limit_gib - used_gib) * 1024
    if spare_mib < 1:
        return f"{limit_gib:.1f} GiB, all of the limit (under 1 MiB to spare)"
    left = f"{spare_mib / 1024:.1f} GiB" if spare_mib >= 1024 else f"{spare_mib:,.0f} MiB"
    return f"{used_gib:.{gib_digits(used_gib, limit_gib)}f} of {limit_gib:.1f} GiB, {left} to spare"


def bottleneck(problem: Problem, result: Result) -> str:
    """The largest part of the step besides compute, and the link it runs on."""
    plan, est = result.plan, result.estimate
    parts = dict(est.time_breakdown_s)
    compute = parts.pop("compute", 0.0)
    part, seconds = max(parts.items(), key=lambda kv: kv[1])
    share = f"{format_seconds(seconds)}, {seconds / est.step_time_s:.0%} of the step"
    head = (f"compute is {compute / est.step_time_s:.0%} of the step (MFU {est.mfu:.0%}); "
            "the largest other part is ")
    if part in ("tp_comm", "cp_comm", "dp_comm", "pp_comm"):
        axis = part[:2]
        links = axis_links(problem.cluster, plan, axis)
        return (head + f"{axis.upper()} communication ({share}) over "
                f"{_describe_links(problem, links)}.")
    if part == "ep_comm":
        return head + (f"the expert-parallel all-to-alls ({share}) of the routed tokens over "
                       f"{plan.ep} ranks.")
    if part == "bubble":
        return head + (f"the pipeline bubble ({share}): {plan.pp} stages and "
                       f"{plan.num_microbatches} micro-batches per step.")
    return head + f"the optimizer step ({share})" + (
        f" with {plan.offload.value} offloaded to the CPU." if plan.offload is not Offload.NONE
        else ".")


def runners_up(table: Table, chosen: int, *, count: int = 8) -> list[RunnerUp]:
    """The best fitting plan of each other (TP, PP) shape, fastest first: the solver's exact
    runners-up (``Table.runners_up``), the same list the solve report shows."""
    shapes = [(u.tp, u.pp) for u in table.runners_up(chosen, count=count)]
    best = best_by_shape(table.eligible(), table.plans, table.order)
    base = table.step_times_s[chosen]
    out = []
    for shape in shapes:
        row = best[shape]
        out.append(RunnerUp(tp=shape[0], pp=shape[1], plan=one_line(table.plans[row]),
                            step_time_s=table.step_times_s[row],
                            slower_by=table.step_times_s[row] / base - 1,
                            peak_memory_gib=table.peak_bytes[row] / 2**30, fits=True))
    return out


def _with_cluster(problem: Problem, **changes) -> Problem:
    return replace(problem, cluster=replace(problem.cluster, **changes))


def _what_if(change: str, problem: Problem, pins: Pins, chosen: Plan, base_s: float) -> WhatIf:
    """Solve ``problem`` (a changed copy) and compare with the chosen plan."""
    table = Table.build(problem, pins)
    row = best_row(table)
    if row is None:
        return WhatIf(change=change, plan=None, step_time_s=None, speedup=None, plan_changes=True)
    plan, step_s = table.plans[row], table.step_times_s[row]
    return WhatIf(change=change, plan=one_line(plan), step_time_s=step_s,
                  speedup=base_s / step_s - 1, plan_changes=_key(plan) != _key(chosen))


def what_ifs(problem: Problem, chosen: Plan, base_s: float, pins: Pins) -> list[WhatIf]:
    """Re-solve with 1.5x memory, 2x intra-node and 2x inter-node bandwidth."""
    more = replace(problem, mem_limit_bytes=problem.mem_limit_bytes * 1.5)
    out = [_what_if(f"1.5x GPU memory ({problem.mem_limit_bytes * 1.5 / 2**30:.0f} GiB)", more,
                    pins, chosen, base_s)]
    cluster = problem.cluster
    faster_intra = _with_cluster(problem, intra=replace(
        cluster.intra, bandwidth_Bps=2 * cluster.intra.bandwidth_Bps))
    out.append(_what_if(
        f"2x intra-node bandwidth ({2 * cluster.intra.bandwidth_Bps / 1e9:.0f} GB/s per GPU)",
        faster_intra, pins, chosen, base_s))
    if cluster.num_nodes > 1 and cluster.inter is not None:
        faster_inter = _with_cluster(problem, inter=replace(
            cluster.inter, bandwidth_Bps=2 * cluster.inter.bandwidth_Bps))
        out.append(_what_if(
            f"2x inter-node bandwidth ({2 * cluster.inter.bandwidth_Bps * 8 / 1e9:.0f} Gb/s per "
            "NIC)", faster_inter, pins, chosen, base_s))
    return out


def _one_node(problem: Problem, pins: Pins) -> tuple[Plan, float] | None:
    """The best plan and tokens/s on one node of the same cluster, if anything fits."""
    one = _with_cluster(problem, num_nodes=1, hosts=())
    free = Pins(**{k: v for k, v in pins.pinned().items() if k not in ("dp", "tp", "pp")})
    table = Table.build(one, free)
    row = best_row(table)
    return None if row is None else (table.plans[row], table.estimate(row).tokens_per_s)


def warnings(problem: Problem, result: Result, pins: Pins) -> list[str]:
    """What a practitioner would point out about this plan on this cluster."""
    plan, cluster = result.plan, problem.cluster
    out = []
    if plan.tp > cluster.gpus_per_node:
        out.append(f"TP={plan.tp} spans nodes ({cluster.gpus_per_node} GPUs per node): TP's "
                   "all-reduces sit on every layer's critical path; keep TP inside a node.")
    dp = axis_links(problem.cluster, plan, "dp")
    if plan.zero_stage == 3 and dp.crosses_nodes and (
            cluster.inter.kind == "ethernet" or dp.nic_bandwidth_per_gpu < SLOW_NETWORK_BPS):
        shard = problem.graph.num_params / (plan.tp * plan.pp)
        moved = ZERO3_TRAFFIC * PARAM_BYTES * shard * plan.num_microbatches
        out.append(
            f"ZeRO-3 over a slow network: each GPU moves about {ZERO3_TRAFFIC}x its parameter "
            f"bytes per micro-batch ({moved / 1e9:.0f} GB per step here) over "
            f"{dp.nic_bandwidth_per_gpu * 8 / 1e9:.1f} Gb/s, at least "
            f"{moved / dp.nic_bandwidth_per_gpu:.0f} s; prefer PP across nodes with ZeRO-1 at most.")
    if plan.offload is not Offload.NONE:
        out.append(f"{plan.offload.value} offloaded to the CPU: the step is bound by PCIe copies "
                   "and CPU Adam; more GPUs or a smaller model avoid it.")
    if cluster.num_nodes > 1:
        out += _scaling_warnings(problem, result, pins)
    return out


def _scaling_warnings(problem: Problem, result: Result, pins: Pins) -> list[str]:
    one = _one_node(problem, pins)
    if one is None:
        return []
    _, one_tps = one
    est, cluster = result.estimate, problem.cluster
    if est.tokens_per_s <= one_tps:
        return [f"bandwidth-bound: {cluster.num_nodes} nodes give {est.tokens_per_s:,.0f} "
                f"tokens/s, no more than one node's {one_tps:,.0f}; a faster inter-node network "
                "(or fewer nodes) is the fix."]
    efficiency = est.tokens_per_s / (one_tps * cluster.num_nodes)
    if efficiency < POOR_SCALING:
        return [f"poor scaling: {efficiency:.0%} of linear from one node ({one_tps:,.0f} "
                f"tokens/s) to {cluster.num_nodes} ({est.tokens_per_s:,.0f} tokens/s)."]
    return []


def tp_modes(result: Result) -> list[TpMode]:
    """Bytes per transformer layer per micro-batch per GPU of 1D, 2D, 2.5D and 3D TP at the
    plan's TP size (the nearest valid size for each mode), for the plan's model and
    micro-batch; empty when the model's shape is unknown or the plan has no TP."""
    model, plan = result.model, result.plan
    if model is None or not model.hidden_size or plan.tp == 1:
        return []
    seq = result.training.seq_len if result.training else model.seq_len
    rows = compare_tp_modes(tp=plan.tp, hidden=model.hidden_size,
                            tokens=plan.micro_batch_size * seq,
                            ffn=model.ffn_hidden_size, gated=model.gated_mlp)
    return [TpMode(mode=r.mode, gpus=r.gpus, shape=r.shape, bytes_per_layer_per_gpu=r.bytes_per_gpu,
                   vs_1d=r.vs_1d) for r in rows]


def _fully_trained(graph: LayerGraph) -> LayerGraph:
    """The graph as if every parameter trained: every layer in backward, every Linear with
    both gradients, every attention differentiated."""
    def trained(layer):
        return replace(layer, frozen_params=0, frozen_sharded=0, in_backward=True,
                       gemms=tuple(replace(g, wgrad=True, dgrad=True) for g in layer.gemms),
                       attention=tuple(replace(a, backward=True) for a in layer.attention))
    return replace(graph, layers=tuple(trained(layer) for layer in graph.layers))


def fine_tuning_savings(problem: Problem, result: Result) -> str | None:
    """The plan's memory and step against the same plan training every parameter with AdamW,
    stepped after backward, and the weights in the training precision; None when that is what
    the plan does."""
    training = problem.training
    if (problem.graph.num_trainable_params == problem.graph.num_params
            and training.optimizer is Optimizer.ADAMW and not training.optimizer_in_backward
            and training.frozen_storage.value == training.precision.storage):
        return None
    full = replace(problem, graph=_fully_trained(problem.graph),
                   training=training.model_copy(update={"optimizer": Optimizer.ADAMW,
                                                        "frozen_dtype": None,
                                                        "optimizer_in_backward": False}))
    mine, theirs = result.estimate, estimate(full, result.plan)
    saved = {part: theirs.memory_breakdown_gib[part] - mine.memory_breakdown_gib[part]
             for part in ("weights", "gradients", "optimizer")}
    fits = "fits" if theirs.feasible else "does not fit"
    return (f"against training all {problem.graph.num_params:,} parameters with AdamW in "
            f"{training.precision.value} ({theirs.peak_memory_gib:.1f} GiB, {fits}; "
            f"{format_seconds(theirs.step_time_s)} per step), this fine-tune saves "
            f"{saved['gradients']:.1f} GiB of gradients, {saved['optimizer']:.1f} GiB of "
            f"optimizer state and {saved['weights']:.1f} GiB of weights per GPU, and "
            f"{1 - mine.step_time_s / theirs.step_time_s:.0%} of the step"
            + (" (the optimizer steps in backward: one layer's gradients at a time, not the "
               "model's)" if training.optimizer_in_backward else ""))


def frameworks(result: Result) -> list[str]:
    """One sentence per other runtime the solve compared: how much slower its best plan is,
    or why it has none (from the plan JSON's ``runtimes``)."""
    chosen = result.training.runtime if result.training else None
    base, out = result.estimate.step_time_s, []
    for option in result.runtimes or ():
        if option.runtime == chosen:
            continue
        name = RUNTIMES[Runtime(option.runtime)].name
        if option.plan is None:
            out.append(f"{name}: no plan ({option.reason})")
            continue
        out.append(f"{name}: {option.step_time_s / base - 1:+.1%} per step "
                   f"({format_seconds(option.step_time_s)}, {one_line(option.plan)}, "
                   f"{option.peak_memory_gib:.1f} GiB)")
    return out


def explain_plan(problem: Problem, result: Result, pins: Pins = Pins()) -> Explanation:
    """The explanation of ``result``, a plan for ``problem`` (found under ``pins``)."""
    table = Table.build(problem, pins)
    chosen = _row_of(table, result.plan)
    notes = []
    best = best_row(table)
    if best is not None and table.step_times_s[best] < result.estimate.step_time_s * (1 - 1e-6):
        notes.append(f"not the fastest fitting plan: {one_line(table.plans[best])} takes "
                     f"{format_seconds(table.step_times_s[best])}; was the plan pinned?")
    return Explanation(
        plan=one_line(result.plan), step_time_s=result.estimate.step_time_s,
        binding=binding(table, problem, chosen, pins), bottleneck=bottleneck(problem, result),
        runners_up=runners_up(table, chosen),
        what_ifs=what_ifs(problem, result.plan, result.estimate.step_time_s, pins),
        warnings=notes + warnings(problem, result, pins), tp_modes=tp_modes(result),
        fine_tuning=fine_tuning_savings(problem, result),
        frameworks=frameworks(result))


def explain_result(result: Result, model: str | Path | ModuleType | Model,
                   pins: Mapping[str, Any] | Pins | None = None,
                   profile: str | Path | Profile | None = None) -> Explanation:
    """The explanation of a saved plan, rebuilt from its JSON's cluster and training settings
    and the traced model, with a calibration profile's warnings where it may not hold."""
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
    explanation = explain_plan(problem, result, as_pins(pins))
    note = calibration_note(profile, problem, result.plan)
    if note is None or not note.warnings:
        return explanation
    return explanation.model_copy(update={"warnings": [*explanation.warnings, *note.warnings]})


def render(explanation: Explanation, console: Console) -> None:
    """Print the explanation (rich)."""
    from rich.table import Table as RichTable

    e = explanation
    console.print(f"[bold]Why {e.plan}[/] ({format_seconds(e.step_time_s)} per step)")
    console.print(f"[bold]binding:[/] {e.binding}", soft_wrap=True)
    console.print(f"[bold]bottleneck:[/] {e.bottleneck}", soft_wrap=True)
    table = RichTable(title="Runners-up (best plan of each other TP x PP shape)",
                      title_justify="left")
    for column in ("TP", "PP", "plan", "step", "vs this plan", "GiB"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    for u in e.runners_up:
        table.add_row(str(u.tp), str(u.pp), u.plan if u.fits else f"[red]nothing fits[/] ({u.plan})",
                      format_seconds(u.step_time_s), f"{u.slower_by:+.0%}", f"{u.peak_memory_gib:.1f}")
    console.print(table)
    for w in e.what_ifs:
        outcome = ("nothing fits" if w.plan is None else
                   f"{format_seconds(w.step_time_s)} ({w.speedup:+.0%} speed vs this plan)"
                   + (f", plan becomes {w.plan}" if w.plan_changes else ", same plan"))
        console.print(f"[bold]what if[/] {w.change}: {outcome}", soft_wrap=True)
    if e.fine_tuning:
        console.print(f"[bold]fine-tuning:[/] {e.fine_tuning}", soft_wrap=True)
    for line in e.frameworks:
        console.print(f"[bold]other framework[/] {line}", soft_wrap=True)
    for warning in e.warnings:
        console.print(f"[bold yellow]warning:[/] {warning}", soft_wrap=True)
    _render_tp_modes(e.tp_modes, console)


def _render_tp_modes(rows: list[TpMode], console: Console) -> None:
    if not rows:
        return
    from rich.table import Table as RichTable

    table = RichTable(title="TP traffic per transformer layer per micro-batch (Colossal-AI "
                      "2D/2.5D/3D vs Megatron 1D; vs 1D on as many GPUs)", title_justify="left")
    for column in ("TP mode", "GPUs", "bytes per layer per GPU", "vs 1D"):
        table.add_column(column, justify="left" if column == "TP mode" else "right")
    for r in rows:
        table.add_row(f"{r.mode} ({r.shape})", str(r.gpus),
                      f"{r.bytes_per_layer_per_gpu / 2**20:,.1f} MiB", f"{r.vs_1d:.2f}x")
    console.print(table)
