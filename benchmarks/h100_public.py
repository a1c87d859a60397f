"""Predicted against measured step time of public H100 Megatron-Core runs not in ../shared/data.

A hold-out CHECK: nothing in the cost model is fitted to these rows. The rows, each with its
source URL and the figures quoted from it, are benchmarks/data/h100_public_runs.csv:
- MLM-*: the Megatron-LM README's H100 weak-scaling table (images/model_table.png, added in
  NVIDIA/Megatron-LM f2e5db4, July 2024, Megatron-Core r0.8.0): GPT models of 1.7B-462B, vocab
  131072, sequence 4096, on 48-6144 H100, BF16 (the MFU column is TFLOP/s over 989). The table
  gives TFLOP/s per GPU; the measured step time is ``batch * F / (GPUs * TFLOP/s)`` with F the
  FLOPs per sequence of Megatron-LM's own counter at that commit
  (megatron/training/training.py ``num_floating_point_operations``, MHA, 4h MLP, no SwiGLU):
  ``12 s l h^2 (2 + s/h + 4 + V / (2 l h))``. Micro-batch, interleaving and recompute are not
  stated: autoplan's defaults fill them (micro-batch 1, no recompute, no interleaving);
  ``--overlap-param-gather`` needs the distributed optimizer (ZeRO-1) and ``--tp-comm-overlap``
  sequence parallelism, so both are pinned, and ``--tp-comm-overlap`` is priced (runtime
  setting ``tp_comm_overlap``, costmodels/tp_overlap.py). Dropout 0.1 (Megatron-LM's default).
- DGXC-*: NVIDIA DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking 143b90d, NeMo 24.09
  and 24.11), the BF16 tables: "Training step time (seconds per step)" as published, with the
  recipe's TP/PP/CP/VP/MBS and recompute (the recipe yamls: none, Nemotron-4 340B selective),
  DP = GPUs / (TP PP CP), sequence parallel with TP, the distributed optimizer. Nemotron-4's
  squared-ReLU MLP (two matrices of ffn 4h) is posed as a gated MLP of 2/3 of that width: the
  same parameters and GEMM FLOPs (zoo Llama; its rotary, RMSNorm and GQA otherwise as
  Nemotron's). The 405B rows with fewer layers (32-192 GPUs) are left out.
Both run Transformer Engine's attention, which on Hopper picks cuDNN's fused attention over
flash-attn ("Disabling FlashAttention to give FusedAttention preference on Hopper+",
transformer_engine/pytorch/attention.py get_attention_backend): runtime_settings
``{attention_kernel: cudnn}``; and Transformer Engine's modules for the rest of the block
(``--transformer-impl transformer_engine``, Megatron-Core r0.8's and NeMo's default, the megatron
runtime's ``transformer_impl``: its fused element-wise kernels, costmodels/fused_kernels.py). Hardware: DGX H100 nodes (8 H100 SXM 80GB at 700 W, NVLink4 450
GB/s per GPU, 8x 400 Gb/s NDR InfiniBand).
- DGXC-*-FP8-*: the same recipes' FP8 tables (the same yaml, NeMo's ``fp8: true``, hybrid
  format, delayed scaling; same TP/PP/CP/VP), posed with ``--precision fp8`` (costmodels/fp8.py)
  and summarized apart (source DGXC-FP8). What they show (December 2026): every FP8 row is
  predicted faster than measured, by 7-21% (MAE 15.7%) against the BF16 rows' 2-14% (7.4%):
  the measured FP8 speedup over BF16 is 1.34x (Llama 3.1 8B, 70B), 1.36x (Nemotron-4 15B),
  1.46x (340B) and 1.53x (Llama 3.1 405B), the predicted one 1.47x, 1.56x, 1.47x, 1.53x and
  1.64x. The model prices a TE Linear's GEMMs at the FP8
  peak times the GPU's GEMM efficiency (cuBLASLt FP8 GEMMs at 8192^3 reach about 81% of the
  1,979 TFLOP/s peak, as BF16 ones do of theirs) and its casts as HBM passes; what else FP8
  costs on these runs (scaling and amax bookkeeping, FP8 userbuffers, power-limited clocks) is
  not modelled, and nothing is fitted to these rows.

    .venv/bin/python benchmarks/h100_public.py
"""

from __future__ import annotations

import csv
import sys
import types
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoplan.zoo import GPT, GPTConfig, Llama, LlamaConfig, next_token_loss  # noqa: E402
from autoplan.costmodels.step import estimate  # noqa: E402
from fit import pose  # noqa: E402
from nodes import eight_gpu_nodes  # noqa: E402
from published_runs import PublishedRun  # noqa: E402

CSV = Path(__file__).resolve().parent / "data" / "h100_public_runs.csv"
GPU = "h100-sxm5-80gb"


def megatron_flops_per_sequence(row: dict) -> float:
    """Megatron-LM's FLOPs counter (training.py at f2e5db4) for one sequence of an MHA GPT
    with a 4h, non-gated MLP: 12 s l h^2 ((1 + 1 + s/h) + ffn/h + V / (2 l h))."""
    s, l, h, v = (float(row[k]) for k in ("seq", "layers", "hidden", "vocab"))
    ffn = float(row["ffn"])
    return 12 * s * l * h * h * ((2 + s / h) + ffn / h + v / (2 * l * h))


def measured_step_s(row: dict) -> float:
    """The published step time, or (Megatron README) the one its TFLOP/s per GPU implies."""
    value, unit = row["measured"].split(" ", 1)
    if unit == "s/step":
        return float(value)
    flops = int(row["global_batch"]) * megatron_flops_per_sequence(row)
    return flops / (int(row["gpus"]) * float(value) * 1e12)


def _model(row: dict) -> types.ModuleType:
    layers, hidden, heads = int(row["layers"]), int(row["hidden"]), int(row["heads"])
    vocab, ffn = int(row["vocab"]), int(row["ffn"])
    module = types.ModuleType(f"{row['arch']}_{layers}x{hidden}")
    if row["arch"] == "gpt":
        config = GPTConfig(num_layers=layers, hidden_size=hidden, num_heads=heads,
                           vocab_size=vocab, max_seq_len=int(row["seq"]), ffn_hidden_size=ffn)
        module.build_model = lambda: GPT(config)
    else:
        gated = ffn if row["arch"] == "llama" else ffn * 2 // 3  # squared ReLU: 2 matrices of ffn
        config = LlamaConfig(num_layers=layers, hidden_size=hidden, num_heads=heads,
                             num_kv_heads=int(row["kv_heads"]), ffn_hidden_size=gated,
                             vocab_size=vocab)
        module.build_model = lambda: Llama(config)
    module.loss = next_token_loss
    return module


def dgx_h100(gpus: int) -> dict:
    return eight_gpu_nodes(f"dgx-h100-{gpus}", GPU, gpus)


def _pins(row: dict) -> dict:
    pins = {k: int(row[k]) for k in ("tp", "pp", "cp", "dp", "vpp", "mbs") if row[k]}
    pins |= {"zero": 1, "sp": int(row["tp"]) > 1}
    if row["recompute"]:
        pins["recompute"] = row["recompute"]
    return pins


def _ub_cfg(ring_aggregate: int, bulk_sms: tuple[int, int, int, int],
            pipeline_sms: tuple[int, int]) -> dict:
    """A recipe's ``ub_tp_comm_overlap_cfg`` in the keys autoplan prices: the ring exchanges'
    ``aggregate``; ``num_sm`` of qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad (no SM margin) and of
    proj_fprop, fc2_fprop (4 splits, ``set_sm_margin: 1``)."""
    cfg = {op: {"aggregate": ring_aggregate}
           for op in ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")}
    for op, sms in zip(("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"), bulk_sms):
        cfg[op] = {"num_sm": sms, "set_sm_margin": 0}
    for op, sms in zip(("proj_fprop", "fc2_fprop"), pipeline_sms):
        cfg[op] = {"num_sm": sms, "num_splits": 4, "set_sm_margin": 1}
    return cfg


DGXC_TP_OVERLAP = {
    # llama3.1/llama3.1_70b.yaml and llama3.1_405b.yaml at 143b90d: ub_tp_comm_overlap: true with
    # the ub_tp_comm_overlap_cfg written there; nemotron/nemotron4-15b-synth.yaml: true, no cfg
    # (TE's defaults); llama3.1_8b.yaml (TP 1) and nemotron4-340b-synth.yaml: false.
    "DGXC-L31-70B": _ub_cfg(0, (4, 24, 2, 4), (24, 16)),
    "DGXC-L31-405B": _ub_cfg(1, (2, 24, 2, 2), (24, 8)),
    "DGXC-N4-15B": {},
}


def _family(row: dict) -> str:
    """The recipe a row ran (its id less the GPU count and any ``-FP8``)."""
    return row["row_id"].rsplit("-", 1)[0].removesuffix("-FP8")


def _settings(row: dict) -> dict:
    """cuDNN attention for both; ``--tp-comm-overlap`` where the source states it: every
    Megatron README row, and the DGX Cloud recipes of :data:`DGXC_TP_OVERLAP` with their
    configs."""
    settings = {"attention_kernel": "cudnn"}
    family = _family(row)
    if row["row_id"].startswith("MLM") or family in DGXC_TP_OVERLAP:
        settings["tp_comm_overlap"] = True
    if DGXC_TP_OVERLAP.get(family):
        settings["tp_comm_overlap_cfg"] = DGXC_TP_OVERLAP[family]
    return settings


def _source(row: dict) -> str:
    """MLM or DGXC, the FP8 rows apart (DGXC-FP8)."""
    source = row["row_id"].split("-")[0]
    return f"{source}-FP8" if row["precision"] == "fp8" else source


def public_runs() -> list[PublishedRun]:
    with CSV.open() as f:
        rows = list(csv.DictReader(f))
    models: dict[tuple, types.ModuleType] = {}
    runs = []
    for row in rows:
        key = tuple(row[k] for k in ("arch", "layers", "hidden", "heads", "kv_heads", "ffn",
                                     "vocab", "seq"))
        model = models.setdefault(key, _model(row))
        runs.append(PublishedRun(
            row_id=row["row_id"], model=model, cluster=dgx_h100(int(row["gpus"])),
            seq_len=int(row["seq"]), global_batch=int(row["global_batch"]), pins=_pins(row),
            runtime="megatron", precision=row["precision"], step_time_s=measured_step_s(row),
            runtime_settings=_settings(row), source=_source(row), gpu=GPU, attention="flash"))
    return runs


def _print_fp8_speedups(steps: dict[str, tuple[float, float]]) -> None:
    """BF16 over FP8 step time of each DGX Cloud recipe at its smallest GPU count posed in both,
    measured and predicted (``steps``: row id -> (measured, predicted) seconds)."""
    smallest: dict[str, int] = {}
    for row_id in steps:
        if "-FP8-" in row_id:
            family, gpus = row_id.split("-FP8-")
            smallest[family] = min(smallest.get(family, int(gpus)), int(gpus))
    print("\nFP8 speedup over BF16 (same recipe and GPUs): measured / predicted")
    for family, gpus in sorted(smallest.items()):
        bf16, fp8 = steps[f"{family}-{gpus}"], steps[f"{family}-FP8-{gpus}"]
        print(f"  {family:14} {gpus:>5} GPUs  {bf16[0] / fp8[0]:5.2f}x / {bf16[1] / fp8[1]:5.2f}x")


def main() -> None:
    questions, refused = pose(public_runs())
    print(f"{'row':18} {'gpus':>5} {'tp':>2} {'pp':>2} {'cp':>2} {'dp':>4} {'vpp':>3} {'mbs':>3} "
          f"{'rc':9} {'measured s':>10} {'predicted s':>11} {'error':>7}  predicted s: "
          f"compute / tp / dp exposed")
    groups = defaultdict(list)
    steps: dict[str, tuple[float, float]] = {}
    for q in questions:
        p, est = q.plan, estimate(q.problem, q.plan)
        e = est.step_time_s / q.run.step_time_s - 1
        parts = " / ".join(f"{est.time_breakdown_s.get(k, 0.0):.3f}"
                           for k in ("compute", "tp_comm", "dp_comm"))
        print(f"{q.run.row_id:18} {p.world_size:>5} {p.tp:>2} {p.pp:>2} {p.cp:>2} {p.dp:>4} "
              f"{p.vpp:>3} {p.micro_batch_size:>3} {p.recompute.value:9} {q.run.step_time_s:>10.3f} "
              f"{est.step_time_s:>11.3f} {e:>+7.1%}  {parts}")
        groups[q.run.source].append(e)
        groups["all"].append(e)
        steps[q.run.row_id] = (q.run.step_time_s, est.step_time_s)
    print("\n(error = predicted / measured step time - 1; negative = optimistic)")
    for name, errs in groups.items():
        print(f"  {name:6} rows {len(errs):>3}  MAE {sum(map(abs, errs)) / len(errs):6.1%}  "
              f"bias {sum(errs) / len(errs):+6.1%}  worst {max(errs, key=abs):+6.1%}")
    _print_fp8_speedups(steps)
    for run, message in refused:
        print(f"  {run.row_id}: refused: {message}")


if __name__ == "__main__":
    main()
