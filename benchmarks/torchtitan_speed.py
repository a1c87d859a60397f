"""Predicted against measured throughput of torchtitan's published FSDP runs (Llama 2/3/3.1).

Out-of-sample check only: nothing in the cost model is fitted to these rows (none are in
../shared/data). Each run is posed as a new user would: the model's published shape, the GPUs
the source names, the configuration pinned as published (FSDP2 over every GPU, the local batch
as one micro-batch, the activation checkpointing stated), autoplan filling the rest, on the
``fsdp`` runtime (torchtitan's defaults: fp32 gradient reduce-scatter, reshard_after_forward,
op-level selective AC, SDPA flash attention, eager).

Sources (rows keep their tables' names):
- H100: torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md`` (torch 1963fc8, torchtitan
  9dec370, December 2024), Tables 1 and 3: Llama 3.1 8B, sequence 8192 (torchtitan's llama3
  8B default), local batch 2, selective activation checkpointing, tokens/s/GPU eager, with
  torch.compile and with torch.compile + Float8; Tables 4 and 5, torch.compile + Float8 in 2D
  (Llama 3.1 70B, FSDP 32 x TP 8, local batch 16) and 3D (405B, FSDP 8 x TP 8 x PP 8, local
  batch 32, 1F1B and interleaved), full activation checkpointing, TP with sequence parallelism
  as torchtitan always runs it (Table 5's AsyncTP is not modelled: its TP collectives are priced
  unoverlapped; Table 4's AsyncTP row and the CP rows are left out).
  Hardware as the benchmark states it: Grand Teton H100 SXM with 96 GB HBM2e at 2.4 TB/s, run at
  the default 500 W power limit (its footnote: the real peak lies "between SXM and NVL" and is
  not known), 400 Gb/s RDMA per GPU. Posed as the catalog's h100-sxm5-96gb-hbm2e: its 2.4 TB/s,
  and the tensor-core clock at 500 W between NVIDIA's two datasheet operating points of the
  same die (H100 SXM at 700 W, 1830 MHz; H100 NVL at 400 W, 1545 MHz): 886.7 TFLOP/s.
- A100: torchtitan ``docs/performance.md`` as first published (pytorch/torchtitan 0413364,
  2024): Llama 3 8B/70B (sequence 8192) and Llama 2 13B/70B (sequence 4096) on 64 A100 80GB,
  FSDP2, eager; "selective op" is op-level SAC, "full" full AC, "no" none (the "selective
  layer" rows, checkpointing every other block, have no autoplan equivalent and are left out).
  The network is not stated: DGX A100 nodes (8 GPUs on NVSwitch, 8x 200 Gb/s InfiniBand)
  assumed.
torch.compile rows are priced with ``runtime_settings={"compile": True}`` (each block compiled, its
element-wise kernels fused: profiles.yaml ``fsdp.compiled_elementwise_fraction``, measured by
benchmarks/compiled_traffic.py, not fitted to these rows); the speed-up over the eager row of the
same table is printed against the measured one. Float8 rows (torchao's Float8Linear on every
Linear of the blocks, tensorwise scaling, fast accumulation in the output GEMM only, as
Transformer Engine) are posed with ``--precision fp8``: the fsdp runtime's FP8 blocks, at the
FP8 GEMM rate and casts of costmodels/fp8.py (TE's own measurements, none of these rows); their
speed-up over the compiled bf16 row is printed against the measured one.

    .venv/bin/python benchmarks/torchtitan_speed.py
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import autoplan
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from nodes import eight_gpu_nodes
from torchtitan_memory import LLAMA31

MODELS = {
    "L3-8B": LLAMA31["8B"],  # Llama 3 and 3.1 share these shapes
    "L3-70B": LLAMA31["70B"],
    "L31-405B": LLAMA31["405B"],
    # Llama 2 (Touvron et al. 2023; torchtitan's llama2 args: ffn from multiple_of 256, and
    # ffn_dim_multiplier 1.3 with multiple_of 4096 for 70B)
    "L2-13B": LlamaConfig(num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40,
                          ffn_hidden_size=13824, vocab_size=32000),
    "L2-70B": LlamaConfig(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                          ffn_hidden_size=28672, vocab_size=32000),
}


@dataclass(frozen=True)
class Row:
    table: str
    model: str
    gpu: str
    gpus: int
    local_batch: int
    seq_len: int
    recompute: str
    measured_tps: float  # tokens/s/GPU
    compiled: bool = False
    precision: str = "bf16"
    tp: int = 1
    pp: int = 1
    vpp: int = 1


def _rows() -> list[Row]:
    gt = "h100-sxm5-96gb-hbm2e"  # Grand Teton's H100 as the benchmark states it
    h100 = [Row("T1", "L3-8B", gt, 8, 2, 8192, "selective", 5762),
            Row("T1", "L3-8B", gt, 8, 2, 8192, "selective", 6667, True),
            Row("T1", "L3-8B", gt, 8, 2, 8192, "selective", 8532, True, "fp8"),
            Row("T3", "L3-8B", gt, 128, 2, 8192, "selective", 5605),
            Row("T3", "L3-8B", gt, 128, 2, 8192, "selective", 6514, True),
            Row("T3", "L3-8B", gt, 128, 2, 8192, "selective", 8380, True, "fp8"),
            Row("T4", "L3-70B", gt, 256, 16, 8192, "full", 829, True, "fp8", tp=8),
            Row("T5", "L31-405B", gt, 512, 32, 8192, "full", 100, True, "fp8", tp=8, pp=8),
            Row("T5", "L31-405B", gt, 512, 32, 8192, "full", 128, True, "fp8", tp=8, pp=8,
                vpp=2)]
    a100 = [Row("L3", "L3-8B", "a100-sxm4-80gb", 64, 1, 8192, "selective", 2973),
            Row("L3", "L3-70B", "a100-sxm4-80gb", 64, 1, 8192, "full", 331),
            Row("L2", "L2-13B", "a100-sxm4-80gb", 64, 2, 4096, "none", 2162),
            Row("L2", "L2-13B", "a100-sxm4-80gb", 64, 2, 4096, "selective", 1904),
            Row("L2", "L2-70B", "a100-sxm4-80gb", 64, 1, 4096, "selective", 355),
            Row("L2", "L2-70B", "a100-sxm4-80gb", 64, 2, 4096, "full", 353)]
    return h100 + a100


def _model(name: str) -> types.ModuleType:
    module = types.ModuleType(name.replace("-", "_"))
    module.build_model = lambda: Llama(MODELS[name])
    module.loss = next_token_loss
    return module


NETWORK = {"h100-sxm5-96gb-hbm2e": ("450GB/s", "400Gbps"), "h100-sxm5-80gb": ("450GB/s", "400Gbps"),
           "a100-sxm4-80gb": ("300GB/s", "200Gbps")}


def _cluster(gpu: str, gpus: int) -> dict:
    nvlink, nic = NETWORK[gpu]
    return eight_gpu_nodes(f"{gpu}-{gpus}", gpu, gpus, nvlink=nvlink, nic=nic)


def predicted_tps(row: Row, models: dict) -> float:
    """Tokens/s per GPU as torchtitan counts them (a DP rank's tokens over its TP x PP GPUs):
    the local batch cut into pp micro-batches with PP (torchtitan 9dec370 pipeline_llama.py
    ``pipeline_parallel_microbatches or parallel_dims.pp``), two stages a rank interleaved."""
    dp = row.gpus // (row.tp * row.pp)
    plan = {"tp": row.tp, "pp": row.pp, "vpp": row.vpp, "dp": dp, "zero": 3,
            "mbs": row.local_batch // row.pp, "recompute": row.recompute, "sp": row.tp > 1}
    settings = {"compile": True} if row.compiled else None
    e = autoplan.estimate(models[row.model], _cluster(row.gpu, row.gpus), plan,
                          seq_len=row.seq_len, global_batch=row.local_batch * dp,
                          runtime="fsdp", runtime_settings=settings,
                          precision=row.precision).estimate
    return row.local_batch * dp * row.seq_len / (row.gpus * e.step_time_s)


def main() -> None:
    models = {name: _model(name) for name in MODELS}
    print(f"{'table':5} {'model':8} {'gpu':20} {'gpus':>4} {'tp':>2} {'pp':>2} {'vpp':>3} "
          f"{'lbs':>3} {'seq':>5} {'ac':9} {'kernels':11} {'measured':>8} {'predicted':>9} "
          f"{'error':>7}")
    eager, every, baseline = [], [], {}
    for row in _rows():
        tps = predicted_tps(row, models)
        error = row.measured_tps / tps - 1  # step-time error: predicted / measured - 1
        kind = ("compile" if row.compiled else "eager") + ("+fp8" if row.precision == "fp8" else "")
        key = (row.table, row.model, row.gpus)
        speedup = ""
        if row.compiled and key in baseline:  # against the eager row, Float8 the compiled one
            measured, predicted = baseline[key]
            over = "compiled bf16" if row.precision == "fp8" else "eager"
            speedup = (f"  speed-up over {over}: measured {row.measured_tps / measured - 1:+.1%}, "
                       f"predicted {tps / predicted - 1:+.1%}")
        if row.precision == "bf16":
            baseline[key] = (row.measured_tps, tps)
        if not row.compiled:
            eager.append((row.gpu, error))
        every.append((row.gpu, error))
        print(f"{row.table:5} {row.model:8} {row.gpu:20} {row.gpus:>4} {row.tp:>2} {row.pp:>2} "
              f"{row.vpp:>3} {row.local_batch:>3} {row.seq_len:>5} {row.recompute:9} {kind:11} "
              f"{row.measured_tps:>8.0f} {tps:>9.0f} {error:>+7.1%}{speedup}")
    for label, rows in (("eager", eager), ("all", every)):
        for gpu in sorted({g for g, _ in rows}):
            errors = [e for g, e in rows if g == gpu]
            print(f"{gpu} {label} rows: {len(errors)}, step-time MAE "
                  f"{sum(map(abs, errors)) / len(errors):.1%}, "
                  f"bias {sum(errors) / len(errors):+.1%}")


if __name__ == "__main__":
    main()
