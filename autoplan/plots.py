"""Pictures of sweeps and plans (matplotlib, Agg backend: no display needed).

Sweep figures take the ``sweep --json`` document; plan figures take a :class:`Result`. Each
function writes one file (the suffix picks PNG or SVG) and returns its path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.patches import Rectangle  # noqa: E402

from autoplan.errors import OutputExistsError  # noqa: E402
from autoplan.files import check_writable_folder, refuse_existing, replacing, write_errors_as  # noqa: E402
from autoplan.plan import Result, one_line  # noqa: E402
from autoplan.sweep.fronts import FRONTS  # noqa: E402

TIME_PARTS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble", "optimizer")
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "other")
FRONT_TITLES = {
    "time_vs_gpus": ("GPUs", "step time (s)"),
    "cost_vs_time": ("time to train (days)", "cost ($ per million tokens)"),
    "headroom_vs_speed": ("tokens/s", "memory headroom (GiB)"),
}


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=80)
    plt.close(fig)
    return path


def _series(doc: dict, x: str) -> dict[tuple, list[dict]]:
    """Feasible points grouped by every input except ``x`` (one line per group)."""
    groups: dict[tuple, list[dict]] = {}
    for point in doc["points"]:
        if point["plan"] is None:
            continue
        key = tuple(sorted((k, v) for k, v in point["inputs"].items() if k != x))
        groups.setdefault(key, []).append(point)
    return groups


def _label(key: tuple, swept: set[str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in key if k in swept) or "all points"


def _swept(doc: dict) -> set[str]:
    values: dict[str, set] = {}
    for point in doc["points"]:
        for k, v in point["inputs"].items():
            values.setdefault(k, set()).add(v)
    return {k for k, v in values.items() if len(v) > 1}


def scaling_curve(doc: dict, path: str | Path) -> Path:
    """Left: tokens/s against GPUs per series, dotted linear scaling from each series' smallest
    point. Right: scaling efficiency (achieved / linear) against GPUs."""
    fig, (ax, eff) = plt.subplots(1, 2, figsize=(10, 4.2))
    swept = _swept(doc) - {"nodes"}
    for key, pts in _series(doc, "nodes").items():
        pts = sorted(pts, key=lambda p: p["metrics"]["gpus"])
        gpus = [p["metrics"]["gpus"] for p in pts]
        tps = [p["estimate"]["tokens_per_s"] for p in pts]
        line, = ax.plot(gpus, tps, "o-", ms=3, label=_label(key, swept))
        per_gpu = tps[0] / gpus[0]
        ax.plot(gpus, [per_gpu * g for g in gpus], ":", color=line.get_color(), alpha=0.6)
        eff.plot(gpus, [t / (per_gpu * g) for g, t in zip(gpus, tps)], "o-", ms=3,
                 color=line.get_color())
    for axis in (ax, eff):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("GPUs")
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{doc['model']}: throughput (dotted: linear scaling)", fontsize=10)
    eff.set_ylabel("scaling efficiency")
    eff.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    eff.set_title("efficiency vs the series' smallest point", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    return _save(fig, path)


def _point_label(point: dict, swept: set[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in point["inputs"].items() if k in swept) or "point"


def step_breakdown(doc: dict, path: str | Path) -> Path:
    """Stacked bars of each feasible point's step time by part (share of the step)."""
    points = [p for p in doc["points"] if p["plan"] is not None]
    swept = _swept(doc)
    fig, ax = plt.subplots(figsize=(max(6.4, 0.22 * len(points) + 2), 4.2))
    bottoms = [0.0] * len(points)
    for part in TIME_PARTS:
        if not any(part in p["estimate"]["time_breakdown_s"] for p in points):
            continue  # cp_comm exists only for plans with context parallelism
        shares = [p["estimate"]["time_breakdown_s"].get(part, 0.0) / p["estimate"]["step_time_s"]
                  for p in points]
        ax.bar(range(len(points)), shares, bottom=bottoms, label=part.replace("_", " "))
        bottoms = [b + s for b, s in zip(bottoms, shares)]
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([_point_label(p, swept) for p in points], rotation=90, fontsize=6)
    ax.set_ylabel("share of step time")
    ax.set_title(f"{doc['model']}: where the step goes", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, path)


def pareto(doc: dict, path: str | Path) -> Path:
    """The three fronts side by side; front points joined and circled."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    points = [p for p in doc["points"] if p["plan"] is not None]
    for ax, front in zip(axes, FRONTS):
        xs, ys = _front_xy(front, points)
        on = [p["fronts"][front] for p in points]
        ax.scatter(xs, ys, c=["tab:red" if o else "tab:gray" for o in on], s=18)
        front_xy = sorted((x, y) for x, y, o in zip(xs, ys, on) if o)
        if front_xy:
            ax.plot(*zip(*front_xy), "-", color="tab:red", alpha=0.6)
        xlabel, ylabel = FRONT_TITLES[front]
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(front.replace("_", " "), fontsize=10)
        if front == "time_vs_gpus":
            ax.set_xscale("log", base=2)
    fig.suptitle(f"{doc['model']}: Pareto fronts (red)", fontsize=10)
    return _save(fig, path)


def _front_xy(front: str, points: list[dict]) -> tuple[list[float], list[float]]:
    if front == "time_vs_gpus":
        return ([p["metrics"]["gpus"] for p in points],
                [p["estimate"]["step_time_s"] for p in points])
    if front == "cost_vs_time":
        return ([p["metrics"]["time_to_train_days"] for p in points],
                [p["metrics"]["cost_per_million_tokens"] for p in points])
    return ([p["estimate"]["tokens_per_s"] for p in points],
            [p["metrics"]["headroom_gib"] for p in points])


SWEEP_FIGURES = ("scaling", "step_breakdown", "pareto")
PLAN_FIGURES = ("memory_per_stage", "plan_on_cluster")


def sweep_figures(doc: dict, folder: str | Path, *, suffix: str = "png") -> list[Path]:
    """All sweep figures (:data:`SWEEP_FIGURES`) into ``folder``."""
    folder = Path(folder)
    return [draw(doc, folder / f"{name}.{suffix}") for name, draw in
            zip(SWEEP_FIGURES, (scaling_curve, step_breakdown, pareto))]


def memory_per_stage(result: Result, path: str | Path) -> Path:
    """Memory of each pipeline stage against the limit; the worst stage split by part (the
    estimate breaks down only the worst GPU's memory)."""
    est = result.estimate
    stages = est.stage_memory_gib
    worst = max(range(len(stages)), key=lambda s: stages[s])
    fig, ax = plt.subplots(figsize=(max(5.5, 0.35 * len(stages) + 3), 3.8))
    ax.bar(range(len(stages)), stages, color="tab:gray", label="stage total")
    bottom = 0.0
    for part in MEMORY_PARTS:
        value = est.memory_breakdown_gib.get(part, 0.0)
        ax.bar([worst], [value], bottom=bottom, label=part)
        bottom += value
    ax.axhline(est.memory_limit_gib, color="tab:red", linestyle="--", label="limit")
    ax.set_xticks(range(len(stages)))  # whole stages, not matplotlib's 0.5 steps
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(_plan_title(result), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def _plan_title(result: Result) -> str:
    name = result.model.name if result.model else "model"
    return f"{name}: {one_line(result.plan)}"


def rank_coordinates(result: Result, rank: int) -> dict[str, int]:
    """The (tp, cp, dp, pp) coordinates of a global rank under the plan's placement (innermost
    axis first: with tp-cp-dp-pp, consecutive ranks form a TP group), and ``ep`` when the plan
    has expert parallelism: Megatron-core folds each stage's cp x dp replicas into ep x
    expert-dp with ep innermost (parallel_state.py, ``expert_decoder_rank_generator``), so the
    EP rank is the replica index ``cp + CP * dp`` modulo EP."""
    p = result.plan
    sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
    coords = {}
    for axis in p.placement.split("-"):
        coords[axis] = rank % sizes[axis]
        rank //= sizes[axis]
    if p.ep > 1:
        coords["ep"] = (coords["cp"] + p.cp * coords["dp"]) % p.ep
    return coords


AXIS_LETTERS = {"tp": "T", "cp": "C", "dp": "D", "ep": "E"}
AXIS_NAMES = {"tp": "TP", "cp": "CP", "dp": "DP", "ep": "EP"}


@dataclass(frozen=True)
class GpuBox:
    """One GPU of the placement picture: where it sits and what it is told."""

    rank: int
    node: int
    gpu: int
    coords: dict[str, int]
    label: str


@dataclass(frozen=True)
class ClusterLayout:
    """What ``plan_on_cluster`` draws: the nodes shown (every pipeline stage among them) and a
    box per GPU on them; ``note`` says what was left out."""

    gpus_per_node: int
    nodes: int
    shown: tuple[int, ...]
    boxes: tuple[GpuBox, ...]
    note: str


def _degrees(result: Result) -> dict[str, int]:
    """The plan's degrees other than PP that are not 1, in label order."""
    p = result.plan
    sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "ep": p.ep}
    return {axis: size for axis, size in sizes.items() if size > 1}


def _gpu_label(rank: int, coords: dict[str, int], degrees: dict[str, int]) -> str:
    """Rank, then stage and every coordinate whose degree is not 1: ``rank 9 / S1 T1 C0 D2``."""
    others = "".join(f" {AXIS_LETTERS[axis]}{coords[axis]}" for axis in degrees)
    return f"rank {rank}\nS{coords['pp']}{others}"


def _nodes_to_show(stage_of_node: list[set[int]], max_nodes: int) -> tuple[tuple[int, ...], str]:
    """All nodes when they are few; else the first ``max_nodes`` if they hold every stage, else
    the first nodes of each stage, as many per stage as ``max_nodes`` allows (at least one: a
    pipeline usually spans the cluster stage by stage, and every stage must appear)."""
    nodes = len(stage_of_node)
    if nodes <= max_nodes:
        return tuple(range(nodes)), ""
    stages = sorted(set().union(*stage_of_node))
    if set().union(*stage_of_node[:max_nodes]) == set(stages):
        return tuple(range(max_nodes)), f"first {max_nodes} of {nodes} nodes"
    per_stage = max(1, max_nodes // len(stages))
    shown = sorted({n for s in stages
                    for n in [n for n, held in enumerate(stage_of_node) if s in held][:per_stage]})
    first = "the first node" if per_stage == 1 else f"the first {per_stage} nodes"
    note = f"{len(shown)} of {nodes} nodes: {first} of each of the {len(stages)} pipeline stages"
    return tuple(shown), note


def plan_layout(result: Result, *, gpus_per_node: int | None = None,
                max_nodes: int = 16) -> ClusterLayout:
    """Place every rank on its node and GPU (ranks fill nodes in order) and pick the nodes to
    draw, so that every pipeline stage appears however large the cluster."""
    p = result.plan
    per_node = gpus_per_node or (result.cluster or {}).get("gpus_per_node") or min(8, p.world_size)
    nodes = -(-p.world_size // per_node)
    coords = [rank_coordinates(result, rank) for rank in range(p.world_size)]
    stage_of_node = [set() for _ in range(nodes)]
    for rank, c in enumerate(coords):
        stage_of_node[rank // per_node].add(c["pp"])
    shown, note = _nodes_to_show(stage_of_node, max_nodes)
    degrees = _degrees(result)
    boxes = tuple(GpuBox(rank, node, gpu, coords[rank], _gpu_label(rank, coords[rank], degrees))
                  for node in shown for gpu in range(per_node)
                  if (rank := node * per_node + gpu) < p.world_size)
    return ClusterLayout(per_node, nodes, shown, boxes, note)


def _stage_colours(pp: int) -> list:
    """Distinct colours per stage: matplotlib's qualitative maps up to 20 stages, then turbo."""
    if pp <= 20:
        cmap = plt.get_cmap("tab10" if pp <= 10 else "tab20")
        return [cmap(s) for s in range(pp)]
    cmap = plt.get_cmap("turbo")
    return [cmap(0.1 + 0.8 * s / (pp - 1)) for s in range(pp)]


def _stage_layers(result: Result, stage: int) -> str:
    """The layers (LayerGraph indices) pipeline rank ``stage`` runs: one range, or with VPP its
    chunks ``c * pp + stage`` (Megatron's interleaving), the first three listed."""
    p = result.plan
    chunks = [p.stages[c * p.pp + stage] for c in range(p.vpp)]
    ranges = [f"{st.first_layer}-{st.first_layer + st.num_layers - 1}" for st in chunks]
    return ", ".join(ranges[:3]) + (f" ... ({len(ranges)} chunks)" if len(ranges) > 3 else "")


def _stage_legend(result: Result, colours: list) -> list:
    """One patch per pipeline stage naming its layers, and the TP-group outline."""
    handles = [Rectangle((0, 0), 1, 1, color=colours[s],
                         label=f"stage {s}: layers {_stage_layers(result, s)}")
               for s in range(result.plan.pp)]
    if result.plan.tp > 1:
        handles.append(Rectangle((0, 0), 1, 1, fill=False, edgecolor="black", linewidth=1.5,
                                 label=f"one TP group ({result.plan.tp} GPUs)"))
    return handles


def _key_line(result: Result) -> str:
    """What the letters in a box mean, for the degrees this plan has."""
    names = ", ".join(f"{AXIS_LETTERS[a]} = {AXIS_NAMES[a]} rank" for a in _degrees(result))
    chunks = f" of {result.plan.vpp} interleaved chunks" if result.plan.vpp > 1 else ""
    return f"S = pipeline stage{chunks} (colour)" + (f", {names}" if names else "")


def plan_on_cluster(result: Result, path: str | Path, *, gpus_per_node: int | None = None,
                    max_nodes: int = 16) -> Path:
    """One row per node shown, one box per GPU: colour = pipeline stage, text = rank and every
    coordinate (:func:`plan_layout` picks the nodes: every stage appears)."""
    p = result.plan
    layout = plan_layout(result, gpus_per_node=gpus_per_node, max_nodes=max_nodes)
    per_node, rows = layout.gpus_per_node, len(layout.shown)
    colours = _stage_colours(p.pp)
    fig, ax = plt.subplots(figsize=(0.85 * per_node + 3.5, 0.55 * rows + 1.4))
    row_of = {node: row for row, node in enumerate(layout.shown)}
    for box in layout.boxes:
        y = -row_of[box.node]
        ax.add_patch(Rectangle((box.gpu, y), 0.92, 0.85, color=colours[box.coords["pp"]]))
        ax.text(box.gpu + 0.46, y + 0.42, box.label, ha="center", va="center", fontsize=6.5)
        if box.coords["tp"] == 0 and p.tp > 1 and p.placement.startswith("tp") and box.gpu + p.tp <= per_node:
            ax.add_patch(Rectangle((box.gpu - 0.04, y - 0.04), p.tp - 0.04, 0.93, fill=False,
                                   edgecolor="black", linewidth=1.5))
    ax.set_xlim(-0.1, per_node)
    ax.set_ylim(-rows + 0.9, 1)
    ax.set_yticks([-row + 0.42 for row in range(rows)])
    ax.set_yticklabels([f"node {n}" for n in layout.shown], fontsize=7)
    ax.set_xticks([g + 0.46 for g in range(per_node)])
    ax.set_xticklabels([f"GPU {g}" for g in range(per_node)], fontsize=7)
    note = f"\n{layout.note}" if layout.note else ""
    ax.set_title(f"{_plan_title(result)}\n{_key_line(result)}{note}", fontsize=8)
    ax.legend(handles=_stage_legend(result, colours), fontsize=6, loc="upper left",
              bbox_to_anchor=(1.0, 1.0), ncol=-(-p.pp // 24))
    for spine in ax.spines.values():
        spine.set_visible(False)
    return _save(fig, path)


def plan_figures(result: Result, folder: str | Path, *, suffix: str = "png") -> list[Path]:
    """All plan figures (:data:`PLAN_FIGURES`) into ``folder``."""
    folder = Path(folder)
    return [draw(result, folder / f"{name}.{suffix}") for name, draw in
            zip(PLAN_FIGURES, (memory_per_stage, plan_on_cluster))]


def plot_plan(result: Result, folder: str | Path, *, force: bool = False) -> list[Path]:
    """The plan's figures in ``folder``, refusing to overwrite any without ``force`` (then
    nothing is written)."""
    check_writable_folder(Path(folder), flag="--plots")
    if not force:
        refuse_existing([Path(folder) / f"{name}.png" for name in PLAN_FIGURES])
    with write_errors_as(OutputExistsError, "--plots"):
        return plan_figures(result, folder)
