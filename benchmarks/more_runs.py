"""The measured runs of data/more_runs.csv (llm-foundry FSDP, BigScience Megatron-DeepSpeed,
flash-attention's DDP trainer) as autoplan questions, as a new user would pose them: the model
built from the row's shape, the cluster the row names, the configuration pinned as published and
autoplan filling the rest.

Rows that cannot be posed come back as ``Skipped`` with the reason (no measured time, a shape
the source does not state, a precision autoplan does not model), so a benchmark can count them.
What a row does not state and the question needs is an assumption named here, never a fit:
- H100 llm-foundry nodes: the network is not stated; DGX H100 nodes (8x NDR 400 Gb/s) assumed.
- Jean Zay (BigScience): A100 nodes with 4x HDR 200 Gb/s and V100 nodes (4 GPUs) with 4x
  Omni-Path 100 Gb/s assumed; the rows state neither.
- llm-foundry throughput is a window average over a global batch Composer may split unevenly:
  the step compared is ``mbs * grad_accum * dp`` sequences at the published tokens/s/GPU.
- flash-attention's DDPStrategyZero1 all-reduces like DDP and shards only the optimizer step: it
  is posed as the fsdp runtime with ZeRO 0 (DDP's bucketed, overlapped all-reduce).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.profiles import runtime_profile
from autoplan.costmodels.sync import COMPOSER_STEP_OPS, per_op_bytes
from published_runs import DATA, PublishedRun, _gpt_module

CSV = DATA / "more_runs.csv"
FP32_BYTES = 4

GPU_NAMES = {"H100 80GB": "h100-sxm5-80gb", "A100 40GB": "a100-sxm4-40gb",
             "A100 80GB": "a100-sxm4-80gb", "A100-SXM4 80GB": "a100-sxm4-80gb",
             "V100 32GB": "v100-sxm2-32gb", "V100 16GB": "v100-sxm2-16gb"}

NODES = {
    # gpu -> (intra-node link, its per-GPU bandwidth, NIC link, NICs per node, NIC bandwidth)
    "h100-sxm5-80gb": ("nvswitch", "450GB/s", "infiniband", 8, "400Gbps"),
    "a100-sxm4-40gb": ("nvswitch", "300GB/s", "roce", 8, "200Gbps"),  # 1600 Gb/s RoCE per node
    "a100-sxm4-80gb": ("nvswitch", "300GB/s", "roce", 8, "200Gbps"),
    "v100-sxm2-32gb": ("nvlink", "150GB/s", "omnipath", 4, "100Gbps"),
    "v100-sxm2-16gb": ("nvlink", "150GB/s", "omnipath", 4, "100Gbps"),
}
JEAN_ZAY_A100 = ("nvswitch", "300GB/s", "infiniband", 4, "200Gbps")


@dataclass(frozen=True)
class Skipped:
    row_id: str
    source: str
    reason: str


def _cluster(name: str, gpu: str, num_gpus: int, gpus_per_node: int, node: tuple) -> dict:
    intra, intra_bw, nic, nics, nic_bw = node
    link = "infiniband" if nic == "omnipath" else nic
    return {"name": name, "gpu": gpu, "nodes": max(1, num_gpus // gpus_per_node),
            "gpus_per_node": min(gpus_per_node, num_gpus),
            "intra_node": {"link": intra, "bandwidth": intra_bw},
            "inter_node": {"link": link, "nics_per_node": nics, "bandwidth": nic_bw,
                           "latency": "5us"}}


def _gpu(row: dict) -> str | None:
    return next((v for k, v in GPU_NAMES.items() if row["gpu_type"].startswith(k)), None)


def _recompute(text: str) -> str:
    return "full" if text.startswith("full") else "none"


def _zero(row: dict) -> int:
    text = row["zero_or_fsdp"]
    if "FULL_SHARD" in text:
        return 3
    if "SHARD_GRAD_OP" in text:
        return 2
    if "ZeRO-1" in text or "BF16Optimizer" in text:
        return 1
    return 0


def _vocab(text: str) -> int:
    """BigScience's "250k" is BLOOM's tokenizer, 250,880 entries padded (BLOOM model card)."""
    return 250880 if text.startswith("250k") else int(re.match(r"\d+", text).group())


def _why_not(row: dict) -> str | None:
    if row["outcome"] != "success" or not (row["step_time_s"] or row["tokens_per_s_per_gpu"]):
        return f"no measured time (outcome: {row['outcome']})"
    if not row["step_time_s"]:
        return "tokens/s of a fine-tuning recipe without a stated global batch per step"
    if not row["num_layers"] or not row["num_heads"]:
        return "layers or heads not stated in the source"
    if _gpu(row) is None:
        return f"GPU {row['gpu_type']!r} not mapped to the catalog"
    if _above_peak(row):
        return "step time and batch imply more than the GPUs' peak FLOP/s (inconsistent row)"
    return None


def _above_peak(row: dict) -> bool:
    """The row's step would need more than the GPUs' dense peak for its model FLOPs alone
    (6 x 12 L h^2 per token, attention and embedding left out): its stated batch and time
    cannot both be right (BSPRQ-044..046: GBS 2048 in the table, 512 in the text, and the
    row's own TFLOP/s figure fits 512)."""
    if not row["step_time_s"]:
        return False
    layers, hidden = int(row["num_layers"]), int(row["hidden"])
    tokens = int(row["global_batch_seqs"]) * int(row["seq_len"]) if row["global_batch_seqs"] \
        else int(row["micro_batch"]) * int(row["grad_accum"] or 1) * int(row["DP"]) * int(row["seq_len"])
    flops = 6 * 12 * layers * hidden**2 * tokens
    gpu = get_gpu(_gpu(row))
    precision = _precision(row)
    peak = gpu.fp8_flops if precision == "fp8" else gpu.peak_flops(precision)
    return flops / (int(row["num_gpus"]) * float(row["step_time_s"])) > peak


def _precision(row: dict) -> str:
    """The row's training precision: llm-foundry's ``amp_fp8`` is Composer's
    ``te.fp8_autocast`` over MPT's TE layers (autoplan's ``fp8``)."""
    text = row["precision"]
    if text.startswith("fp16"):
        return "fp16"
    return "fp8" if "fp8" in text else "bf16"


def _run(row: dict) -> PublishedRun:
    source = row["row_id"].split("-")[0]
    gpu = _gpu(row)
    n, per_node = int(row["num_gpus"]), int(row["gpus_per_node"])
    node = JEAN_ZAY_A100 if source == "BSPRQ" else NODES[gpu]
    tp, pp, dp = int(row["TP"]), int(row["PP"]), int(row["DP"])
    mbs, ga = int(row["micro_batch"]), int(row["grad_accum"] or 1)
    seq = int(row["seq_len"])
    batch = mbs * ga * dp
    if source == "LLMF":
        step = batch * seq / (float(row["tokens_per_s_per_gpu"]) * n)
    else:
        step = float(row["step_time_s"])
    runtime = "fsdp" if source in ("LLMF", "FA2TRAIN") else "deepspeed"
    zero = 0 if source == "FA2TRAIN" else _zero(row)
    dropout = 0.0 if source == "LLMF" else 0.1  # MPT yamls: attn/resid/emb pdrop 0
    model = _gpt_module(int(row["num_layers"]), int(row["hidden"]), int(row["num_heads"]),
                        _vocab(row["vocab"]), seq, int(row["ffn_hidden"]), dropout)
    pins = {"tp": tp, "pp": pp, "dp": dp, "mbs": mbs, "vpp": 1,
            "recompute": _recompute(row["recompute"]), "sp": False, "zero": zero}
    flash = row["flash_attention"].startswith("y")
    return PublishedRun(
        row_id=row["row_id"], model=model,
        cluster=_cluster(f"{source.lower()}-{n}", gpu, n, per_node, node), seq_len=seq,
        global_batch=batch, pins=pins, runtime=runtime,
        precision=_precision(row),
        step_time_s=step, runtime_settings={**_runtime_settings(source, row["zero_or_fsdp"]),
                                            **_launch_settings(row)},
        source=source, gpu=gpu,
        attention="flash" if flash else "explicit")


def _runtime_settings(source: str, zero_text: str = "") -> dict:
    """What a row's framework does unlike the runtime's default: llm-foundry runs Composer's
    FSDP1 (FlatParameter), whose all-gathers write the flat parameter in place and whose fp32
    gradient cast runs on the post-backward stream, so none of FSDP2's copy kernels
    (profiles.yaml, fsdp.unshard_copy_bytes) sit on its compute stream. Its MPT models compute
    the loss with flash-attn's fused cross-entropy (llm-foundry ``ComposerMPTCausalLM``:
    ``loss_fn='fused_crossentropy'`` by default; ``flash_attn/ops/triton/cross_entropy.py``
    keeps only per-row fp32 losses and log-sum-exps and in backward writes one 16-bit gradient
    the logits' size), not ``cross_entropy(logits.float())``: 2 bytes per logit, not 12. Their
    attention is ``attn_impl: triton`` (the default of scripts/train/benchmarking/
    submit_benchmarks.py, ``--attn_impl``, which sets ``model.attn_impl`` of every run),
    Triton FlashAttention, not flash-attn 2 as the CSV's flash_attention column says
    (costmodels.compute.RELATIVE_KERNELS). Its optimizer step is Composer's DecoupledAdamW
    after FSDP1's clip_grad_norm_, one kernel per tensor operation over fp32 shards (FSDP1
    keeps the sharded flat parameter, its gradient and the moments in fp32):
    costmodels.sync.COMPOSER_STEP_OPS, 24 passes of 4 bytes, not one fused pass.
    BigScience's rows ran Megatron-DeepSpeed's swapped fused-softmax check
    (BIGSCIENCE_SOFTMAX). Its bf16 rows ran DeepSpeed's BF16_Optimizer (ZeRO stage 0, which shards the
    optimizer states like ZeRO-1, so they are posed as ZeRO 1) with its fp32 gradient update
    each micro-batch (profiles.yaml, deepspeed.bf16_optimizer_accumulation_bytes), and it
    all-reduces the gradients (_bf16_reduce_grads, as today). Their ZeRO-1 rows (fp16, 2021-22)
    ran DeepSpeed's ZeRO-1 of the time, whose average_tensor reduced each partition's slice to
    its owner with dist.reduce (DeepSpeed v0.5-v0.12 runtime/zero/stage2.py and
    stage_1_and_2.py), a reduce-scatter's traffic; the bucket all-reduce of the profile
    (deepspeed.zero_grads_all_reduced) came in v0.13 (DeepSpeed PR 4695, November 2023)."""
    if source == "LLMF":
        return {"unshard_copy_bytes": 0, "loss_bytes_per_logit": 2, "attention_kernel": "triton",
                "optimizer_step_traffic_bytes": per_op_bytes(COMPOSER_STEP_OPS, FP32_BYTES)}
    if "BF16Optimizer" in zero_text:
        bf16_optimizer = runtime_profile("deepspeed").bf16_optimizer_accumulation_bytes
        return {"grad_accumulation_bytes": bf16_optimizer, **BIGSCIENCE_SOFTMAX}
    if source in ("BSPRQ", "BS1B3"):
        return {"zero_grads_all_reduced": False, **BIGSCIENCE_SOFTMAX}
    return {}


BIGSCIENCE_SOFTMAX = {"fused_softmax_check": "heads_per_gpu"}
"""Megatron-DeepSpeed's fused-softmax check as BigScience's benchmarks ran it: from 9f5f5d4c
(2021-10-21) to 1cb76a64 (2022-03-06) bigscience-workshop/Megatron-DeepSpeed's
``is_kernel_available`` passes its shapes to ``get_batch_per_block`` in the wrong order, so the
kernel's rows per block come from the heads per GPU and many micro-batch x heads shapes fall
back to eager fp32 softmax (costmodels/fused_softmax.py). The tr3m 1.3B table
(experiments/tr3m-1B3.md, first committed 2021-12-01, a590cbd) and the 176B search
(train/tr11-176B-ml/chronicles-prequel.md, tables dated 02-17 to 02-28 2022) fall in that
window; BLOOM's own run (from 2022-03-11) came after the fix."""


LAUNCH_BLOCKING_FROM = (2, 20)
"""BigScience's 176B search (train/tr11-176B-ml/chronicles-prequel.md) ran with
``CUDA_LAUNCH_BLOCKING=1`` from its tables dated 02-20 on: the section "dealing with JZ hanging
on the large model", written between the 02-17 tables and the 02-20 ones, sets it to overcome
the hangs and measures async runs on 320 GPUs to "always hang" (every later table is 40-48
nodes or a rerun of those settings); its "Hanging Issue" section keeps it ("we will use that
for a time being") and the 176B launch script exports it (train/tr11-176B-ml/
tr11-176B-ml.slurm). The 02-17 tables match the async column of its own comparison (80 GPUs:
97.2 TFLOP/s async, 91.0 with the blocking launches)."""


def _launch_settings(row: dict) -> dict:
    """``launch_blocking`` for a BigScience 176B-search row dated from LAUNCH_BLOCKING_FROM on
    (the date in its table's title); other rows launch asynchronously (the default)."""
    found = re.search(r"\(date (\d\d)-(\d\d)\)", row["table_or_fig"])
    if not row["row_id"].startswith("BSPRQ") or found is None:
        return {}
    if (int(found.group(1)), int(found.group(2))) < LAUNCH_BLOCKING_FROM:
        return {}
    return {"launch_blocking": True}


def out_of_memory_runs() -> list[PublishedRun]:
    """The rows that ran out of memory and state their shape, posed with the configuration
    they tried; they have no measured time (``step_time_s`` is NaN)."""
    with CSV.open() as f:
        rows = [r for r in csv.DictReader(f) if r["outcome"] == "oom"]
    return [_run({**row, "step_time_s": "nan", "tokens_per_s_per_gpu": "nan"}) for row in rows
            if row["num_layers"] and row["num_heads"] and _gpu(row) is not None]


def more_runs() -> tuple[list[PublishedRun], list[Skipped]]:
    """(the rows posed as questions, the rows that cannot be, with why)."""
    with CSV.open() as f:
        rows = list(csv.DictReader(f))
    runs, skipped = [], []
    for row in rows:
        reason = _why_not(row)
        if reason:
            skipped.append(Skipped(row["row_id"], row["row_id"].split("-")[0], reason))
        else:
            runs.append(_run(row))
    return runs, skipped
