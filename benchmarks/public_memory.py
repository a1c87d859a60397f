"""Memory verdicts on public runs that are not in ../shared: Meta's Llama 3 405B (TP 8, PP 16,
DP 64 and 128 at seq 8192), NeMo's published DGX-H100 pre-training recipes (24.07: GPT-3
5B/20B, Llama 2 7B, Llama 3 8B; 24.12, with virtual pipeline stages: GPT-3 175B, Llama 2
13B/70B, Llama 3 70B) and two DGX-B200 ones (Llama 3 70B, Llama 3.1 405B). Every row ran, so
every row must be judged to fit; no memory was published, so the predicted peak is printed
beside the device's memory: allocated and reserved by PyTorch's allocator, and judged (what
"fits" is decided on: reserved plus the CUDA context and NCCL's buffers). Rows and sources: benchmarks/data/public_memory_runs.csv and .md.
Nothing in autoplan is fitted to them.

What it shows (December 2026): 2 of the 15 are refused, Meta's two interleaved variants.
NeMo's rows are posed as its performance recipes run megatron-core (NEMO_PERFORMANCE: bf16
gradient reduction, TE's TP overlap) and in FP8 as they ran (``bf16_with_fp8_mixed``: TE's hybrid FP8 with
--fp8-param-gather, costmodels/fp8.py). Reserved GiB with Megatron-LM's defaults (fp32 main
grads, no TP overlap) -> NeMo's: GPT-3 175B on 128 GPUs 66.5 -> 61.4, on 512 74.1 -> 65.0,
Llama 2 13B 55.0 -> 51.9, Llama 2 70B 57.4 -> 53.5, Llama 3 70B 61.3 -> 57.2; on B200 Llama 3
70B 109.9 -> 97.3 and Llama 3.1 405B 172.7 (refused) -> 160.9 of 167.6. Those two were first
posed as H100 runs (refused at 110 and 173 GiB); the .md says why they are B200 ones.

Meta's rows are posed as ZeRO-2 with fp32 gradients, as Meta ran them (sec. 3.3.2), on the
megatron runtime: Megatron-FSDP's optim_grads. L3-405B-8K, priced at ZeRO-1 (the distributed
optimizer's whole fp32 gradient buffer, 11.9 GiB) 84.5 GiB reserved, refused; at ZeRO-2 77.7
reserved, 79.5 with the CUDA context and NCCL's buffers against the device's 79.6: it fits,
with 60 GiB of activations (15 micro-batches in flight on the second stage; megatron-core
with TE saves 31.75 bytes x s b h / tp per block, costmodels/saved_activations.py) and 4.5 GiB
of Megatron-FSDP's reduce-scatter queue beyond what the backward frees. With 2 chunks per rank
Megatron's interleaved schedule holds up to 47 chunk-micro-batches on a rank, and those two
rows (the paper does not give the chunks) are refused at 112.3 and 83.5 GiB judged.

    .venv/bin/python benchmarks/public_memory.py
"""

from __future__ import annotations

import csv
import types
from pathlib import Path

import autoplan
from autoplan.cluster.catalog import get_gpu
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
    "llama3-8b": lambda seq: Llama(LlamaConfig(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        vocab_size=128256, rope_theta=500000.0)),
    "llama2-7b": lambda seq: Llama(LlamaConfig(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, ffn_hidden_size=11008,
        vocab_size=32000)),
    "gpt3-175b": lambda seq: GPT(GPTConfig(num_layers=96, hidden_size=12288, num_heads=96,
                                           vocab_size=51200, max_seq_len=seq, dropout=0.0)),
    "gpt3-20b": lambda seq: GPT(GPTConfig(num_layers=44, hidden_size=6144, num_heads=48,
                                          vocab_size=51200, max_seq_len=seq)),
    "gpt3-5b": lambda seq: GPT(GPTConfig(num_layers=24, hidden_size=4096, num_heads=32,
                                         vocab_size=51200, max_seq_len=seq)),
}
"""Llama 3/3.1 (Dubey et al. 2024, Table 3), Llama 2 (Touvron et al. 2023, Table 1 and the
released configs), GPT-3 175B (Brown et al. 2020, Table 2.1; NeMo's GPTConfig175B: no
dropout), NeMo's GPTConfig5B and GPTConfig20B (nemo/collections/llm/gpt/model/base.py: 24
layers x 4096, 32 heads; 44 x 6144, 48 heads; FFN 4h)."""

NEMO_PERFORMANCE = {"grad_reduce_in_bf16": True, "tp_comm_overlap": True,
                    "transformer_impl": "transformer_engine"}
"""How NeMo's performance recipes run megatron-core: gradients reduced in bf16
(``recipe.trainer.plugins.grad_reduce_in_fp32 = False`` in scripts/performance/llm/*.py and the
recipes' ``pretrain_performance_optimizations``; the 24.07 launcher's ``grad_sync_dtype=bf16``)
and Transformer Engine's userbuffers TP overlap (MegatronCommOverlapCallback
``tp_comm_overlap=True``), priced with TE's default per-op settings."""

GPUS = {"h100": ("h100-sxm5-80gb", "450GB/s"), "b200": ("b200", "900GB/s")}
"""The row's ``gpu``: catalog GPU and NVLink bandwidth per GPU of its DGX node."""


def _model(name: str, seq: int) -> types.ModuleType:
    module = types.ModuleType(name.replace("-", "_"))
    module.build_model = lambda: MODELS[name](seq)
    module.loss = next_token_loss
    return module


def _cluster(gpu: str, gpus: int) -> dict:
    """DGX H100 nodes (80 GB H100 SXM, NVSwitch, 8 x 400 Gb/s NDR) or DGX B200 nodes (180 GB
    B200, NVLink5)."""
    name, nvlink = GPUS[gpu]
    return eight_gpu_nodes(f"dgx-{gpu}-{gpus}", name, gpus, nvlink=nvlink)


def _settings(row: dict) -> dict | None:
    """NeMo's rows as its performance recipes ran them; Meta's with Megatron-LM's defaults
    (fp32 gradients, as Meta reduced them)."""
    return NEMO_PERFORMANCE if row["source"].startswith("nemo") else None


def _pins(row: dict) -> dict:
    pins = {key: int(row[key]) for key in ("tp", "pp", "cp", "dp", "vpp", "mbs")}
    pins |= {"zero": int(row["zero"]), "recompute": row["recompute"],
             "sp": int(row["tp"]) > 1}
    return pins


def main() -> None:
    with DATA.open() as f:
        rows = list(csv.DictReader(f))
    print(f"{'row':26} {'plan':40} {'prec':4} {'alloc':>6} {'reserv':>6} {'judged':>6} "
          f"{'device':>6} verdict  peak rank")
    refused = 0
    for row in rows:
        seq = int(row["seq_len"])
        cluster = _cluster(row["gpu"], int(row["gpus"]))
        result = autoplan.estimate(_model(row["model"], seq), cluster, _pins(row), seq_len=seq,
                                   global_batch=int(row["global_batch"]), runtime="megatron",
                                   precision=row["precision_run"],
                                   runtime_settings=_settings(row))
        e = result.estimate
        refused += not e.feasible
        plan = " ".join(f"{k}{v}" for k, v in _pins(row).items())
        worst = max(range(len(e.stage_memory_gib)), key=lambda r: e.stage_memory_gib[r])
        device = get_gpu(GPUS[row["gpu"]][0]).memory_bytes / 2**30
        print(f"{row['row_id']:26} {plan:40} {row['precision_run']:4} {e.peak_allocated_gib:6.1f} "
              f"{e.peak_reserved_gib:6.1f} {e.peak_memory_gib:6.1f} {device:6.1f} "
              f"{'fits' if e.feasible else 'REFUSED':8} "
              f"{worst:>4}")
    print(f"\n{len(rows)} runs that ran: refused {refused} (false refusals)")


if __name__ == "__main__":
    main()
