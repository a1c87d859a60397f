"""Predicted against measured memory for torchtitan's published Llama 3.1 runs on H100.

Out-of-sample check only: nothing in the memory model is fitted to these rows. The rows are
the tables of torchtitan's ``benchmarks/llama3_h100_202412_torchtitan.md`` (pytorch/torchtitan,
torch 1963fc8 / torchtitan 9dec370, December 2024): Llama 3.1 8B/70B/405B, FSDP2 with TP
(always with sequence parallelism), PP and CP, selective (op-level SAC) or full activation
checkpointing, memory read as torchtitan's ``max_reserved_gib`` (the allocator's reserved peak,
the maximum over all GPUs). Sequence length is torchtitan's llama3 8B/70B/405B training
default (8192) unless the table states one. The local batch is per data-parallel rank; CP
ranks share their samples, each taking a slice of the sequence (the global batch is the local
one times FSDP's degree). With PP the local batch is cut into as many
micro-batches as there are pipeline ranks (torchtitan 9dec370 ``pipeline_llama.py``:
``pipeline_parallel_microbatches or parallel_dims.pp``), and the interleaved schedule runs two
stages per rank (``generate_split_points``: ``num_stages_per_rank = 2``).

The runs are on Meta's Grand Teton H100s with 96 GB HBM2e (the benchmark's "Hardware"
section; several measured peaks exceed 80 GiB), so the cluster's GPU is an H100 SXM with
that memory; "fits" is judged against it as ``estimate`` does (no headroom).
torch.compile and Float8 (rows that state them) are not modelled: compile lowers the peak
(the 8B table: 82.4 GiB eager, 77.0 compiled), Float8 changes it little (76.8).

    .venv/bin/python benchmarks/torchtitan_memory.py
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import autoplan
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from nodes import eight_gpu_nodes

LLAMA31 = {
    "8B": LlamaConfig(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=128256, rope_theta=500000.0),
    "70B": LlamaConfig(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                       ffn_hidden_size=28672, vocab_size=128256, rope_theta=500000.0),
    "405B": LlamaConfig(num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8,
                        ffn_hidden_size=53248, vocab_size=128256, rope_theta=500000.0),
}
"""Llama 3.1 shapes (Dubey et al. 2024, Table 3; torchtitan's llama3 model args)."""

H100_96GB = {"name": "h100-sxm5-96gb", "memory": "96GiB", "bf16": "989TFLOPS",
             "fp16": "989TFLOPS", "memory_bandwidth": "2.4TB/s"}
"""Grand Teton's H100: 96 GB HBM2e at 2.4 TB/s (the benchmark's "Hardware" section)."""

TORCHTITAN_SEQ = 8192


@dataclass(frozen=True)
class Row:
    table: str
    model: str
    gpus: int
    plan: dict
    local_batch: int
    measured_gib: float
    seq_len: int = TORCHTITAN_SEQ
    note: str = ""


def _rows() -> list[Row]:
    fsdp8 = {"dp": 8, "zero": 3}
    rows = [Row("T1", "8B", 8, {**fsdp8, "mbs": 2, "recompute": "selective"}, 2, 82.4, note="eager"),
            Row("T1", "8B", 8, {**fsdp8, "mbs": 2, "recompute": "selective"}, 2, 77.0, note="compile"),
            Row("T1", "8B", 8, {**fsdp8, "mbs": 2, "recompute": "selective"}, 2, 76.8,
                note="compile+fp8"),
            Row("T3", "8B", 128, {"dp": 128, "zero": 3, "mbs": 2, "recompute": "selective"}, 2, 67.0,
                note="eager"),
            Row("T3", "8B", 128, {"dp": 128, "zero": 3, "mbs": 2, "recompute": "selective"}, 2, 62.0,
                note="compile"),
            Row("T3", "8B", 128, {"dp": 128, "zero": 3, "mbs": 2, "recompute": "selective"}, 2, 61.8,
                note="compile+fp8"),
            Row("T4", "70B", 256, {"tp": 8, "dp": 32, "zero": 3, "mbs": 16, "recompute": "full"}, 16,
                71.9, note="compile+fp8"),
            Row("T4", "70B", 256, {"tp": 8, "dp": 32, "zero": 3, "mbs": 16, "recompute": "full"}, 16,
                67.6, note="compile+fp8+asyncTP"),
            Row("T5", "405B", 512, {"tp": 8, "pp": 8, "dp": 8, "zero": 3, "mbs": 32 // 8,
                                    "recompute": "full"}, 32, 82.5, note="1F1B"),
            Row("T5", "405B", 512, {"tp": 8, "pp": 8, "dp": 8, "zero": 3, "mbs": 32 // 8, "vpp": 2,
                                    "recompute": "full"}, 32, 72.7, note="interleaved")]
    for cp, seq, measured in ((1, 32768, 83.9), (2, 65536, 84.2), (4, 131072, 84.0),
                              (8, 262144, 84.5)):
        rows.append(Row("T2", "8B", 8, {"dp": 8 // cp, "cp": cp, "zero": 3, "mbs": 1,
                                        "recompute": "full"}, 1, measured, seq, "compile+fp8"))
    for cp, seq, measured in ((1, 32768, 75.3), (2, 65536, 75.9), (4, 131072, 77.1),
                              (8, 262144, 84.9)):
        rows.append(Row("T6", "405B", 512, {"tp": 8, "pp": 8, "dp": 8 // cp, "cp": cp, "zero": 3,
                                            "mbs": 8 // 8, "recompute": "full"}, 8, measured, seq,
                        "compile+fp8+asyncTP"))
    return rows


DECEMBER_2024 = {"pp_keeps_last_outputs": True}
"""The runs' torch (1963fc8) keeps every micro-batch's last-stage output in the pipelining
schedule (stage.py ``if self.is_last: self.output_chunks.append(output)``), and torchtitan
9dec370 calls ``pp_schedule.step`` without asking otherwise."""


def _model(name: str) -> types.ModuleType:
    module = types.ModuleType(f"llama31_{name}")
    module.build_model = lambda: Llama(LLAMA31[name])
    module.loss = next_token_loss
    return module


def _cluster(gpus: int) -> dict:
    return eight_gpu_nodes(f"grand-teton-{gpus}", H100_96GB, gpus)


def main() -> None:
    models = {name: _model(name) for name in LLAMA31}
    print(f"{'table':5} {'model':5} {'plan':44} {'seq':>6} {'note':20} {'measured':>8} "
          f"{'reserved':>8} {'error':>7} verdict")
    errors = []
    refused = 0
    for row in _rows():
        e = autoplan.estimate(models[row.model], _cluster(row.gpus), row.plan,
                              seq_len=row.seq_len, global_batch=row.local_batch * row.plan["dp"],
                              runtime="fsdp", runtime_settings=DECEMBER_2024).estimate
        error = e.peak_reserved_gib / row.measured_gib - 1
        errors.append(error)
        refused += not e.feasible
        plan = " ".join(f"{k}{v}" for k, v in row.plan.items())
        print(f"{row.table:5} {row.model:5} {plan:44} {row.seq_len:6} {row.note:20} "
              f"{row.measured_gib:8.1f} {e.peak_reserved_gib:8.1f} {error:+7.1%} "
              f"{'fits' if e.feasible else 'REFUSED'}")
    within = sum(abs(x) <= 0.20 for x in errors)
    print(f"\n{len(errors)} runs: refused {refused}, within 20%: {within}, "
          f"median |error| {sorted(map(abs, errors))[len(errors) // 2]:.1%}")


if __name__ == "__main__":
    main()
