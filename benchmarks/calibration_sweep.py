"""Calibrate on three runs per model of a synthetic sweep, judge on the thousands it never saw
(prints; not a test).

The sweep the issue judges on (the Ultra-Scale Playbook's nanotron runs: Llama-style models
on 1-64 nodes of 8 H100, TP/PP/DP/ZeRO/micro-batch swept) is not among the data this
repository carries, so this benchmark builds one like it and a "truth" to measure it with:

- the grid: Llama-style 1B, 3B and 8B models (32 heads, so TP up to 32 splits them), sequence
  4096, a global batch of 256 sequences (1M tokens), on p5-like nodes (8 H100 on NVSwitch,
  32 EFA interfaces of 100 Gb/s); 1, 2, 4, 8, 16, 32, 64 nodes, every TP 1-32 (across nodes
  beyond 8), PP 1-8, the DP that fills the nodes, micro-batch 1-8 where it divides the batch,
  ZeRO 0 and 1; runtime megatron (a TP/PP/DP/ZeRO-1 framework like nanotron);
- the truth: the cost model on the cluster as it behaves, not as its cluster.yaml states it:
  a slower network (TRUTH_NIC_GBPS), higher network latency (TRUTH_LATENCY,
  TRUTH_NET_LATENCY), lower GEMM and attention efficiency (TRUTH_COMPUTE) and more memory
  outside the model (TRUTH_RUNTIME), each set where a user would state it (the truth's
  cluster.yaml, compute profile and runtime settings), not through costmodels/parameters.py:
  where a fitted parameter fails to reach a place the cost model uses, the truth still does,
  and the figures show it; a
  measurement noise (``--noise``, lognormal, seeded per row); with ``--truth at-scale`` a
  network that keeps slowing with the number of nodes of the job, every inter-node link of it
  alike (congestion the model states only in part: its loss per doubling of nodes,
  ``inter_node_kept_per_doubling``, follows each ring's own span, so a TP pair or a pipeline
  send over 2 nodes of a 64-node job keeps its 2-node bandwidth there); a run whose true peak exceeds the GPU's memory
  ran out of memory (no throughput);
- three runs per model, drawn as a team would (``--draw random``: any three that ran;
  ``spread``: its smallest, a middle and its largest job; ``first``: its first three tries,
  small jobs first), written as a runs.csv (the issue's
  header) and calibrated by ``autoplan calibrate --runs``' own code (api.calibrate_runs);
- the rest judged with the written profile (``--profile``'s path): tokens/s/GPU mean |error|,
  selection loss per (model, GPU count) cell (the measured throughput of the configuration
  predicted fastest among those judged to fit, against the cell's measured best; also without
  the noise), and the share of the runs that ran out of memory judged to fit (and of those that
  ran judged not to).

    .venv/bin/python benchmarks/calibration_sweep.py [--draw random|spread|first] [--seeds 3]
        [--truth in-family|at-scale] [--noise 0.03] [--nodes 1,2,4,...] [--cells]

What the figures say (measured 2026-12-02, ``--seeds 2``, the two draws; ~1 min each on a
loaded 2-core machine, 50-90 s). Since the network loses a share of its busbw per doubling of the
nodes a ring spans (catalog EFA v2: 0.965, fitted as ``inter_node_kept_per_doubling``; before,
a fixed 0.70 from 8 nodes on that no fit could move):
- at-scale: error 47.8% uncalibrated -> 9.1% and 6.3% (before the loss per doubling: 52.1% ->
  13.7% and 6.0%); worst cell 7.9% and 6.7% (27.0% and 6.0% before), 4.3% and 1.6% without the
  noise (26.0% and 2.0%); the noise floor (choosing by the noise-free truth itself, against the
  measured best) is 6.7% in the second draw's worst cell, 1B on 64 GPUs; OOMs judged to fit
  2.2% and 1.2%. The fitted loss per doubling, 0.871 and 0.93, sits above the truth's
  0.965 * 2 ** -0.25 = 0.81 for data-parallel rings: the runs' TP and pipeline traffic over
  2-4 nodes of large jobs, slowed in this truth and not in the model, pulls the other way.
  The first draw's worst cell is 8B on 256 GPUs (tp1 pp4 dp64 chosen, 3,250 measured against
  tp1 pp2 dp128's 3,531);
- in-family: error 25.8% -> 5.8% and 5.6% (before: 27.3% -> 3.6% and 3.2%); worst cell 7.3%
  and 7.3%, the noise floor there (7.3%); without the noise 2.2% and 2.2% (0.7% and 1.6%).
  The fit now spends one of its time parameters on the loss per doubling (0.956 and 0.923 for
  the truth's 0.965), and the plugin's latency per network step (truth 190 us, catalog 75 us),
  which it fitted before, stays at the catalog's: with both, the runs would pin the loss per
  doubling only to 1.21-1.22x, beyond its prior factor of 1.2. With a prior factor of 1.3 or
  1.5 both are fitted in family (0.979 and 0.971, 193 and 200 us; error 3.3% and 3.2%, worst
  without the noise 2.2% and 3.2%), but at-scale's first draw then trades them (loss 0.609 per
  doubling against a NIC efficiency at its bound 0.9; error 11.6%, worst cell 13.6%): kept at
  1.2, the spread measured between EFA's generations (0.84 to 0.965 per doubling);
- ``--draw spread`` (each model's smallest, a middle and its largest job; at-scale, one draw):
  error 6.5%, worst cell 6.7%, its noise floor (8.0% and 7.1% before); without the noise 5.2%
  (3.0% before). Which three runs matters more than how they are fitted; three runs on one
  node (``--draw first``) identify nothing about the network.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import random
import statistics
import tempfile
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from autoplan.api import calibrate_runs, load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_for
from autoplan.costmodels.profiles import compute_profile
from autoplan.costmodels.step import estimate
from autoplan.errors import AutoplanError
from autoplan.runs import HEADER
from autoplan.units import GIB

MODELS = {  # name: (layers, hidden, heads, ffn): Llama 3.2 1B / 3B, Llama 3.1 8B shapes, MHA
    "1B": (16, 2048, 32, 8192),
    "3B": (28, 3072, 32, 8192),
    "8B": (32, 4096, 32, 14336),
}
MODEL_PY = '''from autoplan.zoo import Llama, LlamaConfig, next_token_loss
CONFIG = LlamaConfig(num_layers={0}, hidden_size={1}, num_heads={2}, num_kv_heads={2},
                     ffn_hidden_size={3}, vocab_size=128256)
def build_model():
    return Llama(CONFIG)
def loss(output, inputs):
    return next_token_loss(output, inputs)
'''
CLUSTER_YAML = '''name: p5-x{0}
gpu: h100-sxm5-80gb
nodes: {0}
gpus_per_node: 8
intra_node: {{link: nvswitch, bandwidth: 450GB/s}}
inter_node: {{link: efa, nics_per_node: 32, bandwidth: {1}{2}}}
'''
SEQ_LEN, GLOBAL_BATCH, RUNTIME = 4096, 256, "megatron"
NODES = (1, 2, 4, 8, 16, 32, 64)
TPS, PPS, MBS, ZEROS = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (1, 2, 4, 8), (0, 1)

TRUTH_NIC_GBPS = 45.0
"""The 'measured' network: each EFA interface carries 45 Gb/s of its 100 (a congested fabric:
under half of what nccl-tests reaches on an idle one)..."""

TRUTH_LATENCY, TRUTH_NET_LATENCY = "24us", "190us"
"""... three times the catalog's switch-to-switch latency (8 us) and 2.5 times the latency
aws-ofi-nccl reports per network step (75 us)."""

TRUTH_COMPUTE = {"gemm_efficiency": 0.85, "attention_efficiency": 0.9}
"""Factors on the H100 compute profile: GEMMs and attention slower (clocks under power caps)."""

TRUTH_RUNTIME = {"cuda_context_bytes": 3.75 * GIB, "fragmentation": 0.2}
"""More memory outside the model: 3.75 GiB of CUDA context and NCCL buffers (catalog 1.5) and
twice the allocator fragmentation (catalog 0.10)."""

AT_SCALE_EXPONENT = 0.25
"""--truth at-scale: the interfaces' bandwidth falls further as (nodes / 2) ** -0.25 beyond
two nodes (a sixth less at 4 nodes, 58% at 64): congestion that grows with the job, which no
single constant of the cost model states."""

SELECTION_GOAL, OOM_GOAL, ERROR_GOAL = 0.03, 0.05, 0.15


@dataclass(frozen=True)
class Config:
    model: str
    nodes: int
    tp: int
    pp: int
    dp: int
    mbs: int
    zero: int

    @property
    def gpus(self) -> int:
        return self.nodes * 8

    @property
    def cell(self) -> tuple[str, int]:
        return self.model, self.gpus


@dataclass
class Row:
    config: Config
    problem: object
    """As the planner poses it (catalog constants)."""
    plan: object
    ran: bool = False
    tokens: float = math.nan
    """Measured: the truth's throughput with the measurement noise."""
    true_tokens: float = math.nan
    """The truth's throughput without noise."""
    reserved_gib: float = math.nan


def grid(nodes: tuple[int, ...]) -> list[Config]:
    out = []
    for model, (layers, *_rest) in MODELS.items():
        for n in nodes:
            for tp in TPS:
                for pp in PPS:
                    dp = n * 8 // (tp * pp)
                    if dp < 1 or dp * tp * pp != n * 8 or layers % pp:
                        continue
                    for mbs in MBS:
                        if GLOBAL_BATCH % (dp * mbs):
                            continue
                        for zero in ZEROS:
                            if zero and dp == 1:
                                continue
                            out.append(Config(model, n, tp, pp, dp, mbs, zero))
    return out


def write_inputs(folder: Path, nodes: tuple[int, ...], truth: str) -> None:
    """The models, the clusters as their cluster.yaml states them (catalog EFA), and the
    clusters as they behave (``truth_p5_x*.yaml``)."""
    for name, shape in MODELS.items():
        (folder / f"llama_{name}.py").write_text(MODEL_PY.format(*shape))
    for n in nodes:
        (folder / f"p5_x{n}.yaml").write_text(CLUSTER_YAML.format(n, "100Gbps", ""))
        gbps = TRUTH_NIC_GBPS
        if truth == "at-scale" and n > 2:
            gbps *= (n / 2) ** -AT_SCALE_EXPONENT
        (folder / f"truth_p5_x{n}.yaml").write_text(CLUSTER_YAML.format(
            n, f"{gbps:.2f}Gbps",
            f", latency: {TRUTH_LATENCY}, nccl_net_latency: {TRUTH_NET_LATENCY}"))


TRAINING = training_spec(SEQ_LEN, GLOBAL_BATCH, "bf16", RUNTIME, "flash")


class Problems:
    """The sweep's problems, one per (model, node count) and way of posing it: as the planner
    sees it (``profile`` None: the catalog; a ``calibrate --runs`` profile's path), or as the
    cluster behaves (``truth=True``)."""

    def __init__(self, folder: Path):
        self.folder, self.models, self.cache = folder, {}, {}

    def model(self, name: str):
        return self.models.setdefault(name, load_model(self.folder / f"llama_{name}.py"))

    def get(self, model: str, nodes: int, *, profile: Path | None = None, truth: bool = False):
        key = (model, nodes, profile, truth)
        if key not in self.cache:
            cluster = load_cluster(self.folder / f"{'truth_' if truth else ''}p5_x{nodes}.yaml")
            if truth:
                compute = compute_profile(cluster.cluster.gpu.name)
                compute = dataclasses.replace(compute, **{
                    k: getattr(compute, k) * f for k, f in TRUTH_COMPUTE.items()})
                problem = make_problem(self.model(model), cluster, TRAINING, profile=compute,
                                       runtime_settings=TRUTH_RUNTIME)
            else:
                problem = make_problem(self.model(model), cluster, TRAINING, profile=profile)
            self.cache[key] = (problem, cluster)
        return self.cache[key]


def pose(problems: Problems, configs: list[Config]) -> list[Row]:
    """Each configuration planned on its node count's cluster."""
    rows = []
    for c in configs:
        problem, cluster = problems.get(c.model, c.nodes)
        model = problems.model(c.model)
        pins = dict(tp=c.tp, pp=c.pp, dp=c.dp, cp=1, mbs=c.mbs, zero=c.zero,
                    recompute="none")
        try:
            rows.append(Row(c, problem, plan_for(problem, model, pins)))
        except AutoplanError:
            continue
    return rows


def _noise(row: Row, what: str, sigma: float) -> float:
    seed = zlib.crc32(repr((row.config, what)).encode())
    return math.exp(random.Random(seed).gauss(0.0, sigma)) if sigma else 1.0


def measure(problems: Problems, rows: list[Row], noise: float) -> None:
    """Fill in what the cluster measures: the truth's throughput and reserved peak."""
    for row in rows:
        truth, _ = problems.get(row.config.model, row.config.nodes, truth=True)
        est = estimate(truth, row.plan)
        gpu_bytes = row.problem.cluster.gpu.memory_bytes
        row.ran = est.peak_memory_gib * GIB * _noise(row, "mem", noise / 2) <= gpu_bytes
        if row.ran:
            row.true_tokens = est.tokens_per_s / row.plan.world_size
            row.tokens = row.true_tokens * _noise(row, "time", noise)
            row.reserved_gib = est.peak_reserved_gib * _noise(row, "mem", noise / 2)


def draw(rows: list[Row], how: str, seed: int) -> list[Row]:
    """Three runs per model that ran: any three (``random``), the smallest, a middle and the
    largest job (``spread``: first, middle and last by GPU count, as calibration_runs.py takes
    them by row id), or the team's first three tries (``first``: the smallest jobs, one node
    first, then the next GPU counts)."""
    by_model = defaultdict(list)
    for row in rows:
        if row.ran:
            by_model[row.config.model].append(row)
    chosen = []
    for model in sorted(by_model):
        members = by_model[model]
        if how == "random":
            chosen += random.Random(f"{seed}-{model}").sample(members, 3)
        elif how == "spread":
            ordered = sorted(members, key=lambda r: (r.config.gpus, random.Random(
                f"{seed}-{r.config}").random()))
            chosen += [ordered[0], ordered[len(ordered) // 2], ordered[-1]]
        else:
            ordered = sorted(members, key=lambda r: (r.config.gpus, random.Random(
                f"{seed}-{r.config}").random()))
            picked: list[Row] = []
            for row in ordered:  # a team's first tries: a different GPU count or layout each
                if all(p.config.gpus != row.config.gpus or p.config.tp != row.config.tp
                       for p in picked):
                    picked.append(row)
                if len(picked) == 3:
                    break
            chosen += picked
    return chosen


def write_runs_csv(folder: Path, chosen: list[Row]) -> Path:
    path = folder / "runs.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for r in chosen:
            c = r.config
            writer.writerow([f"llama_{c.model}.py", f"p5_x{c.nodes}.yaml", SEQ_LEN, GLOBAL_BATCH,
                             c.tp, c.pp, c.dp, 1, c.mbs, c.zero, "none", "false", RUNTIME,
                             f"{r.tokens:.2f}", f"{r.reserved_gib:.3f}"])
    return path


@dataclass(frozen=True)
class Judged:
    tokens: float
    fits: bool


def judge(problems: Problems, rows: list[Row], profile: Path | None = None) -> dict[int, Judged]:
    """Each row predicted with the catalog's constants, or with a ``calibrate --runs`` profile
    as ``--profile`` applies it."""
    out = {}
    for i, row in enumerate(rows):
        problem, _ = problems.get(row.config.model, row.config.nodes, profile=profile)
        est = estimate(problem, row.plan)
        out[i] = Judged(est.tokens_per_s / row.plan.world_size, est.feasible)
    return out


def figures(rows: list[Row], judged: dict[int, Judged]) -> dict:
    ran = [i for i, r in enumerate(rows) if r.ran]
    oom = [i for i, r in enumerate(rows) if not r.ran]
    error = statistics.mean(abs(judged[i].tokens / rows[i].tokens - 1) for i in ran)
    cells = defaultdict(list)
    for i in ran:
        cells[rows[i].config.cell].append(i)
    losses, true_losses, floor, why = {}, {}, {}, {}
    for cell, members in cells.items():
        if len(members) < 2:
            continue
        # the planner picks among what it judges to fit; all of them judged not to: the fastest
        candidates = [i for i in members if judged[i].fits] or members
        chosen = max(candidates, key=lambda i: judged[i].tokens)
        best = max(members, key=lambda i: rows[i].tokens)
        losses[cell] = 1 - rows[chosen].tokens / rows[best].tokens
        true_losses[cell] = 1 - rows[chosen].true_tokens / max(rows[i].true_tokens for i in members)
        why[cell] = (rows[chosen], judged[chosen], rows[best], judged[best])
        # the noise floor: what choosing by the noise-free truth itself loses to the measured best
        truest = max(members, key=lambda i: rows[i].true_tokens)
        floor[cell] = 1 - rows[truest].tokens / rows[best].tokens
    return {"error": error, "losses": losses, "true_losses": true_losses, "why": why,
            "floor": floor,
            "oom_fit": sum(judged[i].fits for i in oom), "oom": len(oom),
            "refused": sum(not judged[i].fits for i in ran), "ran": len(ran)}


def report(label: str, f: dict) -> None:
    losses = f["losses"]
    worst = max(losses, key=losses.get)
    within = sum(v <= SELECTION_GOAL + 1e-12 for v in losses.values())
    print(f"  {label:>6}: mean |error| {f['error']:.1%} (goal <= {ERROR_GOAL:.0%}); selection "
          f"mean loss {statistics.mean(losses.values()):.1%}, worst {losses[worst]:.1%} "
          f"({worst[0]} on {worst[1]} GPUs), {within}/{len(losses)} cells within "
          f"{SELECTION_GOAL:.0%} (without the noise: worst {max(f['true_losses'].values()):.1%})"
          f"; noise floor (the truth's own choice) worst {max(f['floor'].values()):.1%}, "
          f"{sum(v <= SELECTION_GOAL + 1e-12 for v in f['floor'].values())}/{len(f['floor'])} "
          f"cells within {SELECTION_GOAL:.0%}; OOM judged to fit {f['oom_fit']}/{f['oom']} "
          f"({f['oom_fit'] / max(f['oom'], 1):.1%}, goal <= {OOM_GOAL:.0%}); ran judged not "
          f"to fit {f['refused']}/{f['ran']}")


def _layout(row: Row, judged: Judged) -> str:
    c = row.config
    return (f"tp{c.tp} pp{c.pp} dp{c.dp} mbs{c.mbs} z{c.zero} measured {row.tokens:,.0f} "
            f"predicted {judged.tokens:,.0f}{'' if judged.fits else ' (judged not to fit)'}")


def report_cells(f: dict) -> None:
    """The five worst cells: the configuration chosen (predicted fastest of those judged to
    fit) against the measured best, each measured and predicted: why the choice missed."""
    for cell, loss in sorted(f["losses"].items(), key=lambda kv: -kv[1])[:5]:
        chosen, chosen_judged, best, best_judged = f["why"][cell]
        print(f"      {cell[0]} on {cell[1]:>3} GPUs: loss {loss:.1%} (noise floor "
              f"{f['floor'][cell]:.1%}, without the noise {f['true_losses'][cell]:.1%}); chose "
              f"{_layout(chosen, chosen_judged)}; best {_layout(best, best_judged)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draw", default="random", choices=["random", "spread", "first"])
    parser.add_argument("--seeds", type=int, default=3, help="draws to calibrate on, one by one")
    parser.add_argument("--truth", default="in-family", choices=["in-family", "at-scale"])
    parser.add_argument("--noise", type=float, default=0.03,
                        help="lognormal sigma of the measured throughput (memory: half)")
    parser.add_argument("--nodes", default=",".join(map(str, NODES)))
    parser.add_argument("--cells", action="store_true", help="print the five worst cells")
    args = parser.parse_args()
    nodes = tuple(int(n) for n in args.nodes.split(","))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_inputs(folder, nodes, args.truth)
        problems = Problems(folder)
        rows = pose(problems, grid(nodes))
        measure(problems, rows, args.noise)
        print(f"sweep: {len(rows)} configurations of {len(MODELS)} models on {nodes} nodes, "
              f"{sum(not r.ran for r in rows)} out of memory in truth ({args.truth}, noise "
              f"{args.noise:.0%}); posed in {time.perf_counter() - start:.0f} s")
        before = figures(rows, judge(problems, rows))
        report("before", before)
        if args.cells:
            report_cells(before)
        for seed in range(args.seeds):
            chosen = draw(rows, args.draw, seed)
            path = write_runs_csv(folder, chosen)
            written = folder / f"profile{seed}.yaml"
            profile = calibrate_runs([path], written, force=True)
            held = [r for r in rows if r not in chosen]
            print(f"draw {seed} ({args.draw}): " + "; ".join(
                f"{r.config.model} {r.config.gpus} GPUs tp{r.config.tp} pp{r.config.pp} "
                f"dp{r.config.dp} mbs{r.config.mbs} z{r.config.zero}" for r in chosen))
            print("  fitted: " + ", ".join(f"{k} {profile.catalog[k]:.3g} -> {v:.3g}"
                                           for k, v in profile.parameters.items())
                  + f"; memory margin {profile.memory_margin:.1%}; calibration runs' error "
                  f"{profile.fit.mean_abs_error_before:.1%} -> {profile.fit.mean_abs_error_after:.1%}"
                  f", leave-one-run-out {profile.fit.loro_mean_abs_error:.1%}")
            for name, reason in profile.fixed.items():
                print(f"    fixed {name}: {reason}")
            after = figures(held, judge(problems, held, written))
            report("after", after)
            if args.cells:
                report_cells(after)
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
