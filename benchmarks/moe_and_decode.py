"""Mixture-of-experts step time and decode time per token against published figures
(out of sample: nothing in the cost model is fitted to them).

1. Mixtral 8x7B, Megatron-core with grouped GEMM and the all-to-all dispatcher on 64 H100
   (TP1 PP4 EP8 VPP8, mbs 1, seq 4096, global batch 256, distributed optimizer): the
   Megatron-core MoE README reports 468 TFLOP/s per GPU (MCore v0.9), 47.3% of 989.
   Also printed: the same model on 32 A100-80GB (the solver's best plan and Megatron's
   TP1 PP4 EP8), for which no measured figure is published.
2. Decode at batch 1 in eager PyTorch, V100-32GB against A800-80GB: practitioners running a
   6B chat model report about 1.4x the time per token on the V100; PyTorch's "GPT, Fast" blog
   (2023) measured Llama-2-7B at 25.5 tokens/s in plain eager code on an A100-80GB.

    .venv/bin/python benchmarks/moe_and_decode.py
"""

from __future__ import annotations

from pathlib import Path

from autoplan import api

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
MIXTRAL = MODELS / "mixtral_8x7b.py"
H100_MIXTRAL_TFLOPS = 468.0  # Megatron-core MoE README, Mixtral 8x7B bf16, MCore v0.9


def dgx(gpu: str, nodes: int, nvlink: str, nic_gbps: int) -> dict:
    return {"name": f"{gpu}-x{nodes}", "gpu": gpu, "nodes": nodes, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": nvlink},
            "inter_node": {"link": "infiniband", "nics_per_node": 8,
                           "bandwidth": f"{nic_gbps}Gbps"}}


def one_gpu(gpu: str) -> dict:
    return {"name": f"{gpu}-x1", "gpu": gpu, "nodes": 1, "gpus_per_node": 1,
            "intra_node": {"link": "pcie", "bandwidth": "32GB/s"}}


def mixtral() -> None:
    pins = {"tp": 1, "pp": 4, "ep": 8, "mbs": 1, "recompute": "none", "zero": 1}
    h100 = api.estimate(MIXTRAL, dgx("h100-sxm5-80gb", 8, "450GB/s", 400), {**pins, "vpp": 8},
                        seq_len=4096, global_batch=256, runtime="megatron").estimate
    print(f"Mixtral 8x7B, 64 H100, Megatron TP1 PP4 EP8 VPP8: {h100.model_tflops_per_gpu:.0f} "
          f"TFLOP/s/GPU, MFU {h100.mfu:.1%} (published {H100_MIXTRAL_TFLOPS:.0f}, "
          f"{H100_MIXTRAL_TFLOPS / 989:.1%}; error "
          f"{h100.model_tflops_per_gpu / H100_MIXTRAL_TFLOPS - 1:+.1%})")
    a100 = dgx("a100-sxm4-80gb", 4, "300GB/s", 200)
    pinned = api.estimate(MIXTRAL, a100, {**pins, "vpp": 2, "recompute": "selective", "zero": 0},
                          seq_len=4096, global_batch=256, runtime="megatron").estimate
    print(f"Mixtral 8x7B, 32 A100, Megatron TP1 PP4 EP8 VPP2 selective: MFU {pinned.mfu:.1%}")
    best = api.solve(MIXTRAL, a100, seq_len=4096, global_batch=256)
    plan = best.plan
    print(f"Mixtral 8x7B, 32 A100, solver's best (TP{plan.tp} PP{plan.pp} DP{plan.dp} "
          f"EP{plan.ep} mbs {plan.micro_batch_size}): MFU {best.estimate.mfu:.1%}")


def decode() -> None:
    for name, context in (("gptj_6b", 2048), ("llama2_7b", 2048), ("gpt_13b", 2048)):
        model = api.load_model(MODELS / f"{name}.py")
        times = {gpu: api.place_for_inference(model, one_gpu(gpu), context_len=context)
                 .time_per_token_s for gpu in ("v100-sxm2-32gb", "a800-sxm4-80gb")}
        ratio = times["v100-sxm2-32gb"] / times["a800-sxm4-80gb"]
        print(f"decode {name} ctx {context}: V100 {times['v100-sxm2-32gb'] * 1e3:.1f} ms, "
              f"A800 {times['a800-sxm4-80gb'] * 1e3:.1f} ms per token, V100/A800 {ratio:.2f} "
              "(practitioners: ~1.4)")


if __name__ == "__main__":
    decode()
    mixtral()
