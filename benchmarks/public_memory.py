"""Memory verdicts on public runs with deep or interleaved pipelines that are not in ../shared:
Meta's Llama 3 405B (TP 8, PP 16, DP 64 and 128 at seq 8192) and NeMo's published DGX-H100
pre-training recipes with virtual pipeline stages (GPT-3 175B, Llama 2 13B/70B, Llama 3
70B/405B). Every row ran, so every row must be judged to fit; no memory was published, so the
predicted peak is printed beside the device's memory. Rows and sources:
benchmarks/data/public_memory_runs.csv and .md. Nothing in autoplan is fitted to them.

What it shows (December 2026): 6 of the 11 are refused (7 while the NeMo rows, which ran in
FP8, were posed in bf16; 10 before the megatron runtime priced a block's activations as
megatron-core with Transformer Engine saves them, costmodels/saved_activations.py). The traced model is the zoo's eager PyTorch Llama (RMSNorm
upcast to fp32, eager rotary, unfused SwiGLU): Llama 3 405B at TP 8 with SP, seq 8192, saved
1.0 GB per block and micro-batch; megatron-core with TE saves 31.75 bytes x s b h / tp (both
norms' inputs and ln_out 2 + 2 + 2 + 2, q, k, v 2.25 with 8 KV heads, the flash output 2,
fc1's output 13 and fc2's input 6.5 with ffn 3.25 h): 0.53 GB. L3-405B-8K now predicts 78.5
GiB allocated, 84.5 reserved: 60 GiB of activations (16 micro-batches in flight on the first
stage) and 11.9 GiB of fp32 gradients, which Meta's framework shards (sec. 3.3.2) and
Megatron-LM's distributed optimizer does not. NEMO-LLAMA3-70B-H100 (TP 2) holds 63 GiB of
model states before any activation. The NeMo rows are posed in FP8 as they ran
(``bf16_with_fp8_mixed``: TE's hybrid FP8 with --fp8-param-gather, costmodels/fp8.py): each TE
Linear keeps its input in 1 byte, the FP8 weights and transposes take the bf16 weights' 2
bytes. Reserved GiB bf16 -> fp8: GPT-3 175B on 128 GPUs 70.1 -> 66.5, on 512 (mbs 2) 81.2 ->
74.1 (now fits), Llama 2 13B 58.5 -> 55.0, Llama 2 70B 60.7 -> 57.4, Llama 3 70B 64.9 -> 61.3,
NEMO-LLAMA3-70B-H100 117.1 -> 109.9, Llama 3.1 405B 182.9 -> 172.7 (both still refused).

    .venv/bin/python benchmarks/public_memory.py
"""

from __future__ import annotations

import csv
import types
from pathlib import Path

import autoplan
from autoplan.zoo import GPT, GPTConfig, Llama, LlamaConfig, next_token_loss
from nodes import eight_gpu_nodes

DATA = Path(__file__).parent / "data" / "public_memory_runs.csv"

MODELS = {
    "llama3-405b": lambda seq: Llama(LlamaConfig(
        num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8, ffn_hidden_size=53248,
        vocab_size=128256, rope_theta=500000.0)),
    "llama3-70b": lambda seq: Llama(LlamaConfig(
        num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, ffn_hidden_size=28672,
        vocab_size=128256, rope_theta=500000.0)),
    "llama2-70b": lambda seq: Llama(LlamaConfig(
        num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, ffn_hidden_size=28672,
        vocab_size=32000)),
    "llama2-13b": lambda seq: Llama(LlamaConfig(
        num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40, ffn_hidden_size=13824,
        vocab_size=32000)),
    "gpt3-175b": lambda seq: GPT(GPTConfig(num_layers=96, hidden_size=12288, num_heads=96,
                                           vocab_size=51200, max_seq_len=seq, dropout=0.0)),
}
"""Llama 3/3.1 (Dubey et al. 2024, Table 3), Llama 2 (Touvron et al. 2023, Table 1 and the
released configs), GPT-3 175B (Brown et al. 2020, Table 2.1; NeMo's GPTConfig175B: no
dropout)."""


def _model(name: str, seq: int) -> types.ModuleType:
    module = types.ModuleType(name.replace("-", "_"))
    module.build_model = lambda: MODELS[name](seq)
    module.loss = next_token_loss
    return module


def _cluster(gpus: int) -> dict:
    """DGX H100 nodes (80 GB H100 SXM, NVSwitch, 8 x 400 Gb/s NDR)."""
    return eight_gpu_nodes(f"dgx-h100-{gpus}", "h100-sxm5-80gb", gpus)


def _pins(row: dict) -> dict:
    pins = {key: int(row[key]) for key in ("tp", "pp", "cp", "dp", "vpp", "mbs")}
    pins |= {"zero": int(row["zero"]), "recompute": row["recompute"],
             "sp": int(row["tp"]) > 1}
    return pins


def main() -> None:
    with DATA.open() as f:
        rows = list(csv.DictReader(f))
    print(f"{'row':26} {'plan':40} {'prec':4} {'alloc':>6} {'reserv':>6} {'device':>6} verdict  "
          "peak rank")
    refused = 0
    for row in rows:
        seq = int(row["seq_len"])
        result = autoplan.estimate(_model(row["model"], seq), _cluster(int(row["gpus"])),
                                   _pins(row), seq_len=seq,
                                   global_batch=int(row["global_batch"]), runtime="megatron",
                                   precision=row["precision_run"])
        e = result.estimate
        refused += not e.feasible
        plan = " ".join(f"{k}{v}" for k, v in _pins(row).items())
        worst = max(range(len(e.stage_memory_gib)), key=lambda r: e.stage_memory_gib[r])
        print(f"{row['row_id']:26} {plan:40} {row['precision_run']:4} {e.peak_allocated_gib:6.1f} "
              f"{e.peak_reserved_gib:6.1f} {80.0:6.1f} {'fits' if e.feasible else 'REFUSED':8} "
              f"{worst:>4}")
    print(f"\n{len(rows)} runs that ran: refused {refused} (false refusals)")


if __name__ == "__main__":
    main()
