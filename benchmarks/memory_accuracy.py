"""Predicted vs measured memory for every run in the published data that states its memory or
that it ran out of memory.

Each row is estimated with its own configuration on its own GPU (``estimate`` judges "fits"
against the GPU's whole memory, no headroom). Printed per row: the predicted allocator
reserved peak and the predicted device peak (reserved plus CUDA context and NCCL buffers,
what ``nvidia-smi`` shows) against the measured figure, and for OOM rows the verdict; then the
false fits (OOM rows judged to fit), false refusals (rows that ran judged not to fit) and the
median absolute error per source. Nothing in the memory model is fitted to these rows (the
allocator's ``fragmentation`` is a stated profile constant), so there is no leave-one-source-
out refit to report; the script says so.

Measured figures are compared like for like: BigScience's are ``nvidia-smi`` snapshots of the
first node (the device peak of the pipeline stages on it), torchtune's "peak memory reserved" is
the allocator's reserved peak. The OOM verdict is on the worst GPU of all.

    .venv/bin/python benchmarks/memory_accuracy.py [DATA_DIR]

DATA_DIR holds more_runs.csv (default: the repository's data/ copy).
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import autoplan
from autoplan.errors import AutoplanError
from autoplan.zoo import GPT, GPTConfig, next_token_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from more_runs import BIGSCIENCE_SOFTMAX  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"

BLOOM_VOCAB = 250880
"""BLOOM's padded vocabulary (bigscience/bloom config.json ``vocab_size``), for rows that say
"250k"."""

MEGATRON_DEEPSPEED = {"loss_bytes_per_logit": 6, **BIGSCIENCE_SOFTMAX}
"""Megatron-DeepSpeed computes the loss with Megatron's fused vocab-parallel cross-entropy (its
GPTModelPipe ends in ``float16_to_fp32``, whose fp32 logits the cross-entropy turns in place into
the softmax and the gradient: 4 bytes, plus the 16-bit cast of the gradient: 6); its attention's
softmax as BigScience's 2021-22 branch checked it (more_runs.BIGSCIENCE_SOFTMAX)."""

BF16_OPTIMIZER = {**MEGATRON_DEEPSPEED, "grad_bytes": 2 + 4, "fp32_grad_bytes": 0,
                  "zero_bucket_bytes": 0, "grad_norm_bytes": 0, "grad_upcast_bytes": 4,
                  "step_flattens_grads": False, "reduction_copy_bytes": 2}
"""DeepSpeed's BF16Optimizer (``runtime/bf16_optimizer.py``, ZeRO stage 0 as BigScience ran it:
"bf16 must use z0! it implements its own zero stage 1 equivalent"): the bf16 ``param.grad`` of
every parameter (2 bytes, kept across micro-batches: ``update_hp_grads(clear_lp_grads=False)``)
and ``fp32_groups_gradients_flat``, a ``zeros_like`` of the whole flat bf16 group in fp32 (4
bytes, unsharded: the prequel's "4bytes x params and it's not sharded"), beside the sharded fp32
master and Adam moments (``fp32_groups_flat_partition``: 12/d). It reduces the gradients with
``buffered_allreduce_fallback`` over those flat buffers, without ZeRO's IPG bucket, and takes
the norm of the fp32 gradients as they are (``get_global_norm_of_tensors``: ``.float()`` of an
fp32 tensor copies nothing). After each micro-batch's backward ``update_hp_grads`` adds every
bf16 gradient into its fp32 one through ``lp.grad.data.to(hp_grad.dtype)``, a 4-byte copy of one
parameter's gradient at a time (``grad_upcast_bytes``); its step works on those flat fp32
buffers, with no flattening copy (``step_flattens_grads``). The engine's all-reduce of those
fp32 buffers casts each to the bf16 communication dtype (``allreduce_bucket``:
``tensor.to(communication_data_type)``), a 2-byte copy per parameter of the stage
(``reduction_copy_bytes``, memory.reduction_copy_bytes)."""

MEGATRON_DROPOUT = 0.1
"""Megatron-DeepSpeed's ``--hidden-dropout`` and ``--attention-dropout`` defaults
(megatron/arguments.py); BigScience's tr3m-1B3 and tr11-176B slurm scripts do not set them."""

GPUS = {"A100 80GB": "a100-sxm4-80gb", "V100 32GB": "v100-sxm2-32gb",
        "V100 16GB": "v100-sxm2-16gb"}


@dataclass(frozen=True)
class MemoryRow:
    row_id: str
    source: str
    outcome: str
    measured_gib: float | None
    measured_kind: str  # "device" (nvidia-smi) or "reserved" (allocator)
    question: dict | None  # estimate() keywords, None when the row cannot be asked
    reason: str = ""
    measured_stages: int = 0  # the first pipeline stages the measurement covers (0: all)


def _int(text: str) -> int | None:
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


@cache
def _gpt(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> types.ModuleType:
    module = types.ModuleType(f"gpt_{layers}x{hidden}")
    config = GPTConfig(num_layers=layers, hidden_size=hidden, num_heads=heads,
                       vocab_size=vocab, max_seq_len=seq, dropout=MEGATRON_DROPOUT)
    module.build_model = lambda: GPT(config)
    module.loss = next_token_loss
    return module


def _cluster(gpu: str, num_gpus: int, per_node: int) -> dict:
    """Jean Zay's nodes (links do not change memory: 4 x 100 Gb/s per node, as stated)."""
    return {"name": f"{gpu}-{num_gpus}", "gpu": gpu, "nodes": max(1, num_gpus // per_node),
            "gpus_per_node": min(per_node, num_gpus),
            "intra_node": {"link": "nvlink", "bandwidth": "150GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 4, "bandwidth": "100Gbps",
                           "latency": "5us"}}


def _gpu(text: str) -> str | None:
    return next((name for key, name in GPUS.items() if text.startswith(key)), None)


def _bigscience(row: dict) -> MemoryRow:
    """A Megatron-DeepSpeed row on DeepSpeed's PipelineEngine: fp16 rows ran DeepSpeed's ZeRO-1
    optimizer, bf16 rows the BF16Optimizer (BF16_OPTIMIZER)."""
    layers, hidden, heads = _int(row["num_layers"]), _int(row["hidden"]), _int(row["num_heads"])
    gpu = _gpu(row["gpu_type"])
    vocab = BLOOM_VOCAB if row["vocab"].startswith("250k") else _int(row["vocab"])
    base = _base(row)
    if not (layers and hidden and heads and gpu and row["TP"] and row["micro_batch"]):
        return MemoryRow(**base, question=None,
                         reason="the row does not state layers, heads, GPU or degrees")
    bf16 = row["precision"].startswith("bf16")
    seq = int(row["seq_len"])
    recompute = ("full" if row["recompute"].startswith("full")
                 else "none" if row["recompute"].startswith("none") else "selective")
    question = dict(
        model=_gpt(layers, hidden, heads, vocab, seq),
        cluster=_cluster(gpu, int(row["num_gpus"]), int(row["gpus_per_node"])),
        plan_or_pins={"tp": int(row["TP"]), "pp": int(row["PP"]), "dp": int(row["DP"]),
                      "mbs": int(row["micro_batch"]), "zero": _zero_stage(row),
                      "recompute": recompute},
        seq_len=seq, global_batch=int(row["global_batch_seqs"]),
        runtime="deepspeed", precision="bf16" if bf16 else "fp16",
        attention="explicit", runtime_settings=BF16_OPTIMIZER if bf16 else MEGATRON_DEEPSPEED)
    return MemoryRow(**base, question=question, measured_stages=_first_node_stages(row))


def _zero_stage(row: dict) -> int:
    """ZeRO-1 unless the row's table says stage 0 (BSPRQ-048's "ZeRO-0" column)."""
    return 0 if row["zero_or_fsdp"].startswith("ZeRO-0") else 1


def _first_node_stages(row: dict) -> int:
    """Pipeline stages whose GPUs sit on the first node, where BigScience read ``nvidia-smi``:
    Megatron numbers ranks TP fastest, then DP, then PP, so a node of g GPUs holds
    g / (tp * dp) stages (at least part of one)."""
    per_stage = int(row["TP"]) * int(row["DP"])
    return max(1, int(row["gpus_per_node"]) // per_stage)


def _base(row: dict) -> dict:
    measured = row["mem_reserved_peak_GiB"] or row["mem_alloc_peak_GiB"]
    kind = "device" if "nvidia-smi" in row["mem_note"] else "reserved"
    return dict(row_id=row["row_id"], source=row["row_id"].split("-")[0], outcome=row["outcome"],
                measured_gib=float(measured) if measured else None, measured_kind=kind)


def _torchtune(row: dict) -> MemoryRow:
    return MemoryRow(**_base(row), question=None, reason=(
        "torchtune's recipe (8-bit paged AdamW stepped in backward, pure-bf16 weights, or FSDP2 "
        "CPU offload of parameters, gradients and optimizer) is outside the runtimes modelled"))


def memory_rows(data: Path = DATA) -> list[MemoryRow]:
    with (data / "more_runs.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["outcome"] == "oom"
                or r["mem_reserved_peak_GiB"] or r["mem_alloc_peak_GiB"]]
    return [_torchtune(r) if r["row_id"].startswith("TTUNE") else _bigscience(r) for r in rows]


def predict(row: MemoryRow) -> autoplan.Result:
    q = dict(row.question)
    return autoplan.estimate(q.pop("model"), q.pop("cluster"), q.pop("plan_or_pins"), **q)


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    errors: dict[str, list[float]] = {}
    false_fits = false_refusals = judged = 0
    print(f"{'row':12} {'outcome':8} {'measured':>8} {'kind':8} {'allocated':>9} "
          f"{'reserved':>8} {'device':>7} {'limit':>6} {'error':>7}  verdict")
    for row in memory_rows(data):
        if row.question is None:
            print(f"{row.row_id:12} {row.outcome:8} {_gib(row.measured_gib):>8} skipped: "
                  f"{row.reason}")
            continue
        try:
            e = predict(row).estimate
        except AutoplanError as err:
            print(f"{row.row_id:12} {row.outcome:8} refused by autoplan: {str(err)[:100]}")
            continue
        judged += 1
        allocated = e.peak_allocated_gib
        fits = e.feasible
        if row.outcome == "oom":
            verdict = "refused (right)" if not fits else "FALSE FIT"
            false_fits += fits
        else:
            verdict = "fits (right)" if fits else "FALSE REFUSAL"
            false_refusals += not fits
        error = ""
        if row.measured_gib:
            predicted = _compared_gib(row, e)
            relative = predicted / row.measured_gib - 1
            errors.setdefault(row.source, []).append(abs(relative))
            error = f"{relative:+.1%}"
        print(f"{row.row_id:12} {row.outcome:8} {_gib(row.measured_gib):>8} "
              f"{row.measured_kind:8} {allocated:9.1f} {e.peak_reserved_gib:8.1f} "
              f"{e.peak_memory_gib:7.1f} {e.memory_limit_gib:6.1f} {error:>7}  {verdict}")
    print(f"\njudged: {judged}  false fits: {false_fits}  false refusals: {false_refusals}")
    for source, values in sorted(errors.items()):
        print(f"median |error| {source}: {statistics.median(values):.1%} over {len(values)} rows")
    print("leave-one-source-out: nothing in the memory model is fitted to these rows "
          "(no refit to report)")
    report_timed_runs_refused()


def report_timed_runs_refused() -> None:
    """False refusals among the runs that state no memory but ran (their step time was
    measured: llm-foundry, BigScience, flash-attention), posed as accuracy.py poses them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fit import pose
    from more_runs import more_runs

    from autoplan.costmodels.step import estimate

    questions, refused = pose(more_runs()[0])
    by_source: dict[str, list[bool]] = {}
    for q in questions:
        e = estimate(q.problem, q.plan)
        by_source.setdefault(q.run.source, []).append(e.peak_memory_gib > e.memory_limit_gib)
    for run, _ in refused:
        by_source.setdefault(run.source, []).append(True)
    print("\nruns that ran (step time measured) judged not to fit, per source:")
    for source, verdicts in sorted(by_source.items()):
        print(f"  {source:9} {sum(verdicts)} of {len(verdicts)}")


def _compared_gib(row: MemoryRow, e) -> float:
    """The prediction for what was measured: the device peak of the stages on the measured
    node (nvidia-smi), or the allocator's reserved peak."""
    if row.measured_kind != "device":
        return e.peak_reserved_gib
    stages = e.stage_memory_gib[:row.measured_stages] if row.measured_stages else ()
    return max(stages) if stages else e.peak_memory_gib


def _gib(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


if __name__ == "__main__":
    main()
