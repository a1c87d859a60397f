"""Whether Megatron's fused scale-mask-softmax kernel runs, and what its eager fallback costs.

Megatron's explicit (non-flash) attention calls ``FusedScaleMaskSoftmax`` on the
``[b, np, sq, sk]`` scores (micro-batch, heads per GPU, query and key length). Its
``is_kernel_available`` runs the CUDA kernel only where the shapes suit it, and otherwise falls
back to eager PyTorch in fp32 (``forward_torch_softmax``: upcast, scale, masked fill, softmax,
downcast), five kernels each way over fp32 copies of the scores instead of one over 16-bit ones.

The check exists in two variants (runtime setting ``fused_softmax_check``; unset, as every
runtime's default is, explicit attention is priced fused):

- ``key_length``: as megatron-core's ``fused_softmax.py`` has it (and
  bigscience-workshop/Megatron-DeepSpeed from 1cb76a64, 2022-03-06, with a 4096-token limit):
  the kernel's batches per thread block come from the key length (4 beyond 128 tokens), so
  any micro-batch x heads divisible by 4 runs fused, up to 16384 tokens.
- ``heads_per_gpu``: bigscience-workshop/Megatron-DeepSpeed from 9f5f5d4c (2021-10-21) to
  1cb76a64: ``is_kernel_available`` calls ``get_batch_per_block(sq, sk, b, np)`` of a static
  method declared ``(b, np, sq, sk)``, so the CUDA helper reads the heads per GPU as the key
  length, and a causal mask runs fused only where ``b * np`` divides that (smaller, larger)
  threshold: 64 heads at TP 8 (8 per GPU) need a micro-batch of 4, 8, ...; BigScience's
  tr3m 1.3B and 176B-search benchmarks (2021-11 to 2022-02) ran in that window.
"""

from __future__ import annotations

from autoplan.errors import ConstraintError

FUSED_SOFTMAX_CHECKS = ("key_length", "heads_per_gpu")
"""The availability checks a runtime's ``fused_softmax_check`` may name (module docstring)."""

MAX_FUSED_KEY_LENGTH = {"key_length": 16384, "heads_per_gpu": 2048}
"""The longest sequence the kernel takes in each variant (``16 < sk <= 16384`` in
megatron-core, ``16 < sq <= 2048`` at 9f5f5d4c)."""

THREADS_PER_BLOCK = 128
WARP_SIZE = 32

EAGER_FORWARD_BYTES = 36.0
"""HBM bytes per score element of the eager forward, 16-bit scores in and out, fp32 between:
``input.float()`` reads 2 and writes 4, ``input * scale`` 4 + 4, the in-place ``masked_fill_``
4 + 4, ``Softmax`` 4 + 4, ``probs.half()`` 4 + 2 (Megatron-DeepSpeed ``forward_torch_softmax``,
``attention_softmax_in_fp32`` as query-key layer scaling forces it)."""

EAGER_BACKWARD_BYTES = 40.0
"""The same for the autograd of those five ops: the downcast's 2 + 4, softmax's backward
(gradient and saved output in, gradient out) 4 + 4 + 4, the mask's 4 + 4, the scale's 4 + 4,
the upcast's 4 + 2."""

FUSED_FORWARD_BYTES = 4.0
"""The fused kernel reads the 16-bit scores and writes the 16-bit probabilities (priced, like
every memory-bound backward, at costmodels.compute.BACKWARD_TRAFFIC_FACTOR times this)."""

EAGER_EXTRA_KERNELS = 4
"""Kernels the fallback issues beyond the fused kernel, each way (five ops against one)."""

EAGER_SAVED_BYTES = 4.0
"""Per score element, softmax's backward keeps its fp32 output where the fused kernel keeps
its 16-bit one (2); the scale and the casts keep nothing, the mask is broadcast."""

EAGER_WORKING_SHAPES = (4, 4, 2)
"""Bytes per score element of the fallback's transient tensors while softmax runs: the scaled
fp32 copy, the fp32 probabilities, their 16-bit downcast."""


def check_fused_softmax(check: str | None) -> None:
    """Raises ConstraintError for a ``fused_softmax_check`` autoplan does not know."""
    if check is not None and check not in FUSED_SOFTMAX_CHECKS:
        raise ConstraintError(f"runtime setting fused_softmax_check {check!r} is not one "
                              f"autoplan knows; choose from {', '.join(FUSED_SOFTMAX_CHECKS)}.")


def batch_per_block(key_seq_len: int) -> int:
    """Rows of scores one thread block of the kernel takes (``get_batch_per_block`` in
    megatron/fused_kernels/scaled_masked_softmax.h): a warp per row up to 32 elements wide,
    two rows per warp up to 128, 128 threads a block."""
    next_power_of_two = 1 << max(0, key_seq_len - 1).bit_length()
    warp = min(next_power_of_two, WARP_SIZE)
    rows_per_warp = 2 if next_power_of_two <= 128 else 1
    return THREADS_PER_BLOCK // warp * rows_per_warp


def runs_fused(check: str | None, micro_batch: int, heads_per_gpu: int, seq_len: int) -> bool:
    """Whether ``is_kernel_available`` takes the fused kernel for a causal self-attention of
    ``[micro_batch, heads_per_gpu, seq_len, seq_len]`` scores; a runtime without the check
    (None) is priced fused, as its explicit attention always was."""
    if check is None:
        return True
    attn_batches = micro_batch * heads_per_gpu
    threshold_from = seq_len if check == "key_length" else heads_per_gpu
    return (16 < seq_len <= MAX_FUSED_KEY_LENGTH[check] and seq_len % 4 == 0
            and attn_batches % 4 == 0 and attn_batches % batch_per_block(threshold_from) == 0)
