"""Explicit attention's batched GEMMs at head dimensions that are and are not multiples of 8,
measured on the local GPU: the kernel benchmark the head-dimension alignment gap needs.

BigScience's rows whose head dimension is not a multiple of 8 (hidden/heads = 108, 150, 450:
BSPRQ-001..006, 064, 096, 099, 101) run 27% slower than predicted on average against 10.5%
for the other 93 BSPRQ rows (benchmarks/accuracy.py --rows). Megatron's explicit attention
(2022, no flash attention) computes scores with ``torch.baddbmm`` over [b*np, s, hn] views of
the fused QKV output, whose batch stride is hn elements: with hn % 8 != 0 the 16-bit operands
are not 16-byte aligned and cuBLAS cannot use its tensor-core kernels at full speed. This
script prints TFLOP/s of the score (q @ k^T) and context (p @ v) bmms for aligned and
misaligned head dimensions, as Megatron lays them out, so the slowdown can be priced from a
measurement rather than fitted to the rows. Needs a CUDA GPU.

    .venv/bin/python benchmarks/bmm_alignment.py [--seq 2048] [--batch-heads 16]
"""

from __future__ import annotations

import argparse

import torch


def _time(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def measure(seq: int, batch_heads: int, head_dim: int, dtype: torch.dtype) -> tuple[float, float]:
    """(score, context) TFLOP/s for [batch_heads, seq, head_dim] views strided as Megatron's
    [s, b*np, 3*hn] fused QKV output."""
    qkv = torch.randn(seq, batch_heads, 3 * head_dim, device="cuda", dtype=dtype)
    q, k, v = qkv.split(head_dim, dim=-1)
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [b*np, s, hn], batch stride 3*hn
    scores = torch.empty(batch_heads, seq, seq, device="cuda", dtype=dtype)
    flops = 2.0 * batch_heads * seq * seq * head_dim
    score_s = _time(lambda: torch.baddbmm(scores, q, k.transpose(1, 2), beta=0.0))
    context_s = _time(lambda: torch.bmm(scores, v))
    return flops / score_s / 1e12, flops / context_s / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch-heads", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bmm_alignment.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, seq {args.seq}, {args.batch_heads} heads x batch")
    print(f"{'dtype':6} {'hn':>4} {'hn%8':>4} {'score TFLOP/s':>14} {'context TFLOP/s':>16}")
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim in (104, 108, 112, 144, 150, 152, 448, 450, 456):
            score, context = measure(args.seq, args.batch_heads, head_dim, dtype)
            print(f"{str(dtype)[6:]:6} {head_dim:>4} {head_dim % 8:>4} {score:>14.1f} "
                  f"{context:>16.1f}")


if __name__ == "__main__":
    main()
