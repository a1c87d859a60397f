"""What attention costs in the llm-foundry rows, read from the rows themselves, against the
published kernel speeds autoplan prices.

For one MPT model on 8 GPUs, a GPT step's cost per token is ``a + b * s``: everything but the
score work is per token, the score work grows with the context ``s``. Two rows of the same
model and checkpointing at sequence lengths s1 < s2 (the shortest and longest from 4k on) give
``b = (1/tps(s2) - 1/tps(s1)) / (s2 - s1)``, seconds per token per context token, and the
model's shape gives what the kernels' published speeds make of it: ``L h`` times the FLOPs per
unit of context (forward 4, backward 10, one forward more under full recompute), halved when
the kernel skips the masked half (causal), at flash-attn 2's causal rate or at its rate without
a mask. H100 rates are those of costmodels/profiles.yaml (the FlashAttention-3 paper's tables
at 16k); A100 has one efficiency for the masked kernel, so only the causal column is printed.
The H100 rows come out at 0.93-1.00 of the unmasked cost (MPT-30b's 4k-8k pair aside) and 1.7-1.8
of the masked one, the A100 rows at 1.6-2.0 of the masked one (MPT-30b aside): the llm-foundry runs pay about
what flash-attn 2 takes without a causal mask, though their MPT calls it with causal=True. Their
kernel is not flash-attn 2 but Triton FlashAttention (``attn_impl: triton``, the benchmark
script's default), which autoplan prices at half flash-attn 2's rate (2.0 of the masked cost:
costmodels.compute.RELATIVE_KERNELS, from its authors' statements, not from these rows).

Diagnostic only: nothing here is fitted or fed back.

    .venv/bin/python benchmarks/llmf_attention_cost.py
"""

from __future__ import annotations

import csv
from collections import defaultdict

from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import attention_rate
from autoplan.costmodels.profiles import compute_profile
from more_runs import CSV, GPU_NAMES

LONG = 16384  # where the published tables plateau


def _catalog_gpu(row: dict) -> str:
    return next(v for k, v in GPU_NAMES.items() if row["gpu_type"].startswith(k))


def _pairs() -> dict:
    groups = defaultdict(list)
    with CSV.open() as f:
        for row in csv.DictReader(f):
            if (not row["row_id"].startswith("LLMF") or row["outcome"] != "success"
                    or "fp8" in row["precision"] or row["num_gpus"] != "8"
                    or not row["tokens_per_s_per_gpu"] or int(row["seq_len"]) < 4096):
                continue
            key = (_catalog_gpu(row), row["model_name"], row["recompute"].startswith("full"),
                   int(row["num_layers"]) * int(row["hidden"]))
            groups[key].append((int(row["seq_len"]), float(row["tokens_per_s_per_gpu"])))
    return {k: sorted(v) for k, v in groups.items() if len(v) >= 2}


def _predicted(gpu: str, lh: int, full: bool, causal: bool) -> float:
    """Seconds per token per context token the priced kernel takes (``lh``: layers x hidden)."""
    profile, peak = compute_profile(gpu), get_gpu(gpu).peak_flops("bf16")
    fwd_flops, bwd_flops = 4.0 * lh * (2 if full else 1), 10.0 * lh
    half = 0.5 if causal else 1.0
    rates = attention_rate(profile, peak, "flash2", LONG, causal)
    if rates is None:
        if not causal:
            return float("nan")
        rate = peak * profile.attention_efficiency  # over the tiles computed: half of them
        rates = (rate, rate)
    return half * (fwd_flops / rates[0] + bwd_flops / rates[1])


def main() -> None:
    print(f"{'gpu':16} {'model':9} {'ckpt':4} {'s1-s2':>11} {'measured b':>11} "
          f"{'causal':>9} {'no mask':>9} {'/causal':>8} {'/no mask':>8}")
    for (gpu, model, full, lh), points in sorted(_pairs().items()):
        (s1, t1), (s2, t2) = points[0], points[-1]
        measured = (1 / t2 - 1 / t1) / (s2 - s1)
        causal, dense = (_predicted(gpu, lh, full, c) for c in (True, False))
        print(f"{gpu:16} {model:9} {'full' if full else 'none':4} {f'{s1}-{s2}':>11} "
              f"{measured:>11.2e} {causal:>9.2e} {dense:>9.2e} {measured / causal:>8.2f} "
              f"{measured / dense:>8.2f}")


if __name__ == "__main__":
    main()
