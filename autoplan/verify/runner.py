"""``autoplan verify``: run a plan on CPU, one gloo process per rank, next to a single-process
reference with the same initial weights and the same batches, and compare.

What is compared:

* losses: the mean micro-batch loss of every step, parallel (averaged over data-parallel ranks,
  read on the last pipeline stage) against the reference, which accumulates the same global batch
  in the same micro-batches; fp32 throughout, dropout off, attention on the math kernel;
* memory: each rank's peak of live tensor bytes over the training steps (after the model is
  built), next to autoplan's memory model evaluated on this model at its real dimensions in
  fp32 (see :mod:`autoplan.verify.memory`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from autoplan.errors import VerifyError
from autoplan.graph.layer_graph import LayerGraph
from autoplan.graph.loader import ModelSource, load_model_source
from autoplan.graph.trace import trace_model
from autoplan.plan import Plan

logger = logging.getLogger(__name__)

SEED = 1234
MAX_LOCAL_WORLD = 8


def batches(vocab_size: int, plan: Plan, seq_len: int, steps: int) -> list[torch.Tensor]:
    """The global batch of token ids of every step (the same for reference and parallel)."""
    gen = torch.Generator().manual_seed(SEED + 1)
    return [torch.randint(0, vocab_size, (plan.global_batch_size, seq_len), generator=gen)
            for _ in range(steps)]


def vocab_of(graph) -> int:
    return graph.dims.vocab_size if graph.dims and graph.dims.vocab_size else 2


@contextlib.contextmanager
def one_thread():
    """Run torch on one intra-op thread (tiny matmuls; threads would only contend with the
    ranks for the cores), restoring the caller's setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_losses(source: ModelSource, graph: LayerGraph, plan: Plan, seq_len: int,
                     steps: int) -> list[float]:
    """Losses of the single-process run: the whole global batch, the plan's micro-batches."""
    from autoplan.verify.parallel import LEARNING_RATE, build_reference, loss_of, math_attention
    model = build_reference(source, seed=SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, foreach=False)
    count = plan.dp * plan.num_microbatches
    out = []
    with math_attention(), one_thread():
        for tokens in batches(vocab_of(graph), plan, seq_len, steps):
            losses = []
            for chunk in tokens.chunk(count):
                loss = loss_of(source, model(chunk), chunk)
                (loss / count).backward()
                losses.append(loss.detach())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            out.append(float(torch.stack(losses).mean()))
    return out


@dataclass(frozen=True)
class _Run:
    """What every rank of one parallel run shares (inherited through ``fork``)."""

    source: ModelSource
    graph: LayerGraph
    plan: Plan
    seq_len: int
    steps: int
    out_dir: Path
    timeout_s: float


def _rank_main(rank: int, run: _Run) -> None:
    """One rank of the parallel run, in a forked child; writes ``rank<N>.json`` (its report)
    and ``rank<N>.log`` (its output) into ``run.out_dir``."""
    log = open(run.out_dir / f"rank{rank}.log", "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    try:
        _train_rank(rank, run)
    except BaseException:
        _stamp_failure(run.out_dir, rank)
        raise


def _stamp_failure(out_dir: Path, rank: int) -> None:
    """Write when this rank failed (CLOCK_MONOTONIC, one clock for every process here): when
    one rank's error makes its peers fail too (gloo closes their connections), the earliest
    stamp names the rank that failed first."""
    (out_dir / f"rank{rank}.failed").write_text(repr(time.monotonic()))


def first_to_fail(out_dir: Path, failed: int) -> int:
    """The rank whose failure stamp is earliest; ``failed`` (the first exit seen) where no
    rank stamped one (it was killed, or timed out)."""
    stamps = {int(path.stem.removeprefix("rank")): float(path.read_text())
              for path in out_dir.glob("rank*.failed")}
    return min(stamps, key=stamps.get) if stamps else failed


def _train_rank(rank: int, run: _Run) -> None:
    """The rank's training steps and its report (imports after the output is redirected, so
    their warnings land in the rank's log)."""
    import torch.distributed as dist

    from autoplan.verify.memory import PeakMemory
    from autoplan.verify.parallel import build_rank
    torch.set_num_threads(1)  # up to 8 ranks share this machine's cores
    plan, world = run.plan, run.plan.world_size
    store = dist.FileStore(str(run.out_dir / "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=run.timeout_s))
    try:
        rank_model = build_rank(run.source, run.graph, plan, seed=SEED, seq_len=run.seq_len)
        data = batches(vocab_of(run.graph), plan, run.seq_len, run.steps)
        per_dp = plan.global_batch_size // plan.dp
        losses = []
        with PeakMemory(rank_model) as memory:
            for tokens in data:
                local = tokens[rank_model.dp_rank * per_dp:(rank_model.dp_rank + 1) * per_dp]
                losses.append(rank_model.train_step(local))
        report = {"rank": rank, "pp_rank": rank_model.pp_rank, "dp_rank": rank_model.dp_rank,
                  "tp_rank": rank_model.mesh.get_local_rank("tp"), "losses": losses,
                  "peak_bytes_measured": memory.peak_bytes,
                  "peak_reserved_bytes_replayed": memory.reserved_bytes}
        (run.out_dir / f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def parallel_reports(source: ModelSource, graph: LayerGraph, plan: Plan, seq_len: int,
                     steps: int, *, timeout_s: float = 600.0) -> list[dict]:
    """Run the plan with one process per rank, forked from this one (which has imported torch
    and traced the model already, so a rank starts in milliseconds), gloo over a FileStore;
    each rank's report, by rank.

    Raises:
        VerifyError: a rank failed; the message carries the end of its error output.
    """
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="autoplan-verify-") as out_dir:
        run = _Run(source, graph, plan, seq_len, steps, Path(out_dir), timeout_s)
        procs = [context.Process(target=_rank_main, args=(rank, run), daemon=True)
                 for rank in range(plan.world_size)]
        for proc in procs:
            proc.start()
        failed = _wait(procs, timeout_s)
        if failed is not None:
            failed = first_to_fail(Path(out_dir), failed)
            text = Path(out_dir, f"rank{failed}.log").read_text()
            raise VerifyError(f"rank {failed} of the parallel run failed:\n{_tail(text)}")
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text())
                for r in range(plan.world_size)]


def _wait(procs, timeout_s: float) -> int | None:
    """Wait for every rank; on the first failure stop the others (each by its own pid) and
    return the failed rank."""
    deadline = time.monotonic() + timeout_s
    failed = None
    while failed is None and any(p.is_alive() for p in procs):
        if time.monotonic() > deadline:
            failed = next(r for r, p in enumerate(procs) if p.is_alive())
            break
        failed = next((r for r, p in enumerate(procs) if p.exitcode not in (None, 0)), None)
        time.sleep(0.02)
    if failed is None:
        failed = next((r for r, p in enumerate(procs) if p.exitcode), None)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()
    return failed


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(line for line in text.splitlines() if "Warning" not in line)[-4000:]


def parallel_losses(plan: Plan, reports: list[dict], steps: int) -> list[float]:
    """Per-step loss of the parallel run: the last pipeline stage's, averaged over data-parallel
    ranks (every TP rank computes the same loss; rank 0 of TP is read)."""
    holders = [r for r in reports if r["pp_rank"] == plan.pp - 1 and r["tp_rank"] == 0]
    return [sum(r["losses"][s] for r in holders) / len(holders) for s in range(steps)]


def relative_differences(reference: list[float], parallel: list[float]) -> list[float]:
    return [abs(p - r) / max(abs(r), 1e-12) for r, p in zip(reference, parallel)]


def verify_plan(model_path: str, plan: Plan, *, seq_len: int, steps: int,
                predicted_bytes: list[float], notes: list[str] | None = None) -> dict:
    """Run ``plan`` and its single-process reference for ``steps`` steps and compare them.

    Args:
        predicted_bytes: the memory model's bytes for each pipeline rank.

    Returns:
        The ``autoplan verify --json`` document.
    """
    _check_runnable(plan)
    source = load_model_source(model_path)
    graph = trace_model(source, seq_len=seq_len, precision="fp32")
    reference = reference_losses(source, graph, plan, seq_len, steps)
    reports = parallel_reports(source, graph, plan, seq_len, steps)
    parallel = parallel_losses(plan, reports, steps)
    return {
        "world_size": plan.world_size, "steps": steps,
        "losses_reference": reference, "losses_parallel": parallel,
        "max_rel_loss_diff": max(relative_differences(reference, parallel)),
        "ranks": [{"rank": r["rank"], "pp_rank": r["pp_rank"], "dp_rank": r["dp_rank"],
                   "tp_rank": r["tp_rank"], "peak_bytes_measured": r["peak_bytes_measured"],
                   "peak_reserved_bytes_replayed": r["peak_reserved_bytes_replayed"],
                   "peak_bytes_predicted": round(predicted_bytes[r["pp_rank"]])}
                  for r in reports],
        "notes": list(notes or []),
    }


def _check_runnable(plan: Plan) -> None:
    problems = []
    if plan.world_size > MAX_LOCAL_WORLD:
        problems.append(f"its world size {plan.world_size} exceeds the {MAX_LOCAL_WORLD} local "
                        "processes verify starts; plan for a smaller cluster (e.g. "
                        "examples/clusters/dgx-a100-x1.yaml)")
    if plan.cp > 1:
        problems.append("context parallelism (cp > 1) is not built by the verifier")
    if plan.offload.value != "none":
        problems.append("CPU offload has no meaning on a CPU-only run")
    if problems:
        raise VerifyError("cannot verify this plan: " + "; ".join(problems) + ".")
