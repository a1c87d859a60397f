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

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autoplan.errors import VerifyError
from autoplan.graph.loader import load_model_source
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


def reference_losses(model_path: str, plan: Plan, seq_len: int, steps: int) -> list[float]:
    """Losses of the single-process run: the whole global batch, the plan's micro-batches."""
    from autoplan.verify.parallel import LEARNING_RATE, build_reference, loss_of, math_attention
    source = load_model_source(model_path)
    graph = trace_model(source, seq_len=seq_len, precision="fp32")
    model = build_reference(source, seed=SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, foreach=False)
    count = plan.dp * plan.num_microbatches
    out = []
    for tokens in batches(vocab_of(graph), plan, seq_len, steps):
        losses = []
        with math_attention():
            for chunk in tokens.chunk(count):
                loss = loss_of(source, model(chunk), chunk)
                (loss / count).backward()
                losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.append(float(torch.stack(losses).mean()))
    return out


def _worker(rank: int, spec: dict) -> None:
    """One rank of the parallel run; writes ``rank<N>.json`` into ``spec["out_dir"]``."""
    import torch.distributed as dist

    from autoplan.verify.memory import PeakMemory
    from autoplan.verify.parallel import build_rank
    torch.set_num_threads(1)
    plan = Plan.model_validate_json(spec["plan"])
    seq_len, steps, world = spec["seq_len"], spec["steps"], plan.world_size
    source = load_model_source(spec["model"])
    graph = trace_model(source, seq_len=seq_len, precision="fp32")
    store = dist.TCPStore("127.0.0.1", spec["port"], world, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        rank_model = build_rank(source, graph, plan, seed=SEED, seq_len=seq_len)
        data = batches(vocab_of(graph), plan, seq_len, steps)
        per_dp = plan.global_batch_size // plan.dp
        losses = []
        with PeakMemory(rank_model) as memory:
            for tokens in data:
                local = tokens[rank_model.dp_rank * per_dp:(rank_model.dp_rank + 1) * per_dp]
                losses.append(rank_model.train_step(local))
        report = {"rank": rank, "pp_rank": rank_model.pp_rank, "dp_rank": rank_model.dp_rank,
                  "tp_rank": rank_model.mesh.get_local_rank("tp"), "losses": losses,
                  "peak_bytes_measured": memory.peak_bytes}
        Path(spec["out_dir"], f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parallel_reports(model_path: str, plan: Plan, seq_len: int, steps: int, *,
                     timeout_s: float = 600.0) -> list[dict]:
    """Run the plan with one process per rank (``python -m autoplan.verify.runner``, gloo on
    127.0.0.1); each rank's report, by rank.

    Raises:
        VerifyError: a rank failed; the message carries the end of its error output.
    """
    with tempfile.TemporaryDirectory(prefix="autoplan-verify-") as out_dir:
        spec = {"model": str(Path(model_path).resolve()), "plan": plan.model_dump_json(),
                "seq_len": seq_len, "steps": steps, "out_dir": out_dir, "port": _free_port()}
        spec_path = Path(out_dir, "spec.json")
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = []
        for rank in range(plan.world_size):
            log = open(Path(out_dir, f"rank{rank}.log"), "w")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "autoplan.verify.runner", str(spec_path), str(rank)],
                stdout=log, stderr=subprocess.STDOUT, env=env), log))
        failed = _wait(procs, timeout_s)
        if failed is not None:
            text = Path(out_dir, f"rank{failed}.log").read_text()
            raise VerifyError(f"rank {failed} of the parallel run failed:\n{_tail(text)}")
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text())
                for r in range(plan.world_size)]


def _wait(procs, timeout_s: float) -> int | None:
    """Wait for every rank; on the first failure stop the others (each by its own pid) and
    return the failed rank, preferring one whose error is not a broken connection."""
    deadline = time.monotonic() + timeout_s
    failed = None
    while any(p.poll() is None for p, _ in procs) and failed is None:
        if time.monotonic() > deadline:
            failed = next(r for r, (p, _) in enumerate(procs) if p.poll() is None)
            break
        failed = next((r for r, (p, _) in enumerate(procs) if p.poll() not in (None, 0)), None)
        time.sleep(0.05)
    if failed is None:
        failed = next((r for r, (p, _) in enumerate(procs) if p.returncode), None)
    for proc, log in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()
    return failed


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(line for line in text.splitlines() if "Warning" not in line)[-4000:]


def parallel_losses(plan: Plan, reports: list[dict], steps: int) -> list[float]:
    """Per-step loss of the parallel run: the last pipeline stage's, averaged over data-parallel
    ranks (every TP rank computes the same loss; rank 0 of TP is read)."""
    holders = [r for r in reports if r["pp_rank"] == plan.pp - 1 and r["tp_rank"] == 0]
    return [sum(r["losses"][s] for r in holders) / len(holders) for s in range(steps)]


if __name__ == "__main__":
    _worker(int(sys.argv[2]), json.loads(Path(sys.argv[1]).read_text()))


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
    reference = reference_losses(model_path, plan, seq_len, steps)
    reports = parallel_reports(model_path, plan, seq_len, steps)
    parallel = parallel_losses(plan, reports, steps)
    return {
        "world_size": plan.world_size, "steps": steps,
        "losses_reference": reference, "losses_parallel": parallel,
        "max_rel_loss_diff": max(relative_differences(reference, parallel)),
        "ranks": [{"rank": r["rank"], "pp_rank": r["pp_rank"], "dp_rank": r["dp_rank"],
                   "tp_rank": r["tp_rank"], "peak_bytes_measured": r["peak_bytes_measured"],
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
