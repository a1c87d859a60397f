"""Megatron's fused-softmax availability check and the cost of its eager fallback.

The oracle for the check is Megatron-DeepSpeed's own code, transcribed below as it stands at
bigscience-workshop/Megatron-DeepSpeed 9f5f5d4c (``megatron/model/fused_softmax.py``, with
``get_batch_per_block`` of ``megatron/fused_kernels/scaled_masked_softmax.h``), arguments in the
order that commit passes them; the costs are worked by hand from the bytes each eager op moves.
"""

import math

import pytest

from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import Split, attention_time
from autoplan.costmodels.fused_softmax import batch_per_block, runs_fused
from autoplan.costmodels.host import layer_host_delay_s
from autoplan.costmodels.memory import layer_activation_bytes
from autoplan.costmodels.profiles import compute_profile, runtime_profile
from autoplan.errors import ConstraintError
from autoplan.plan import Recompute
from autoplan.problems import runtime_with
from tests.costmodels.layers import attention_layer


def _header_get_batch_per_block(query_seq_len, key_seq_len, batches, attn_heads):
    """scaled_masked_softmax.h ``get_batch_per_block``, transcribed."""
    log2_elements = math.ceil(math.log2(key_seq_len)) if key_seq_len > 1 else 0
    next_power_of_two = 1 << log2_elements
    warp_size = next_power_of_two if next_power_of_two < 32 else 32
    batches_per_warp = 2 if next_power_of_two <= 128 else 1
    warps_per_block = 128 // warp_size
    return warps_per_block * batches_per_warp


def _static_get_batch_per_block(b, np, sq, sk):
    """FusedScaleMaskSoftmax.get_batch_per_block at 9f5f5d4c: declared (b, np, sq, sk), it
    forwards (sq, sk, b, np) to the CUDA helper."""
    return _header_get_batch_per_block(sq, sk, b, np)


def _is_kernel_available_9f5f5d4c(b, np, sq, sk):
    """is_kernel_available at 9f5f5d4c for a causal mask, which calls
    ``self.get_batch_per_block(sq, sk, b, np)``."""
    attn_batches = b * np
    if 16 < sq <= 2048 and sk % 4 == 0 and attn_batches % 4 == 0:
        if 0 <= sk <= 2048:
            batch_per_block = _static_get_batch_per_block(sq, sk, b, np)
            return attn_batches % batch_per_block == 0
    return False


def test_rows_per_block_are_the_headers():
    for key in (1, 2, 7, 8, 12, 16, 26, 32, 64, 100, 128, 129, 1024, 2048, 4096):
        assert batch_per_block(key) == _header_get_batch_per_block(2048, key, 1, 1), key
    # worked by hand: 8 -> a warp of 8 lanes, 16 warps, 2 rows each; 2048 -> 4 warps, 1 row
    assert (batch_per_block(8), batch_per_block(12), batch_per_block(26),
            batch_per_block(2048)) == (32, 16, 8, 4)


def test_the_swapped_check_matches_megatron_deepspeed_9f5f5d4c():
    for b in range(1, 17):
        for np in range(1, 129):
            for s in (512, 1024, 2048):
                assert runs_fused("heads_per_gpu", b, np, s) == \
                    _is_kernel_available_9f5f5d4c(b, np, s, s), (b, np, s)


def test_what_bigscience_ran_at_tp_8():
    # 64 heads on TP 8 (8 a GPU): fused at micro-batch 4 and 8 only; 96 heads (12): at 4;
    # 104 heads on TP 4 (26): not at 2, where 64 and 128 heads are
    assert [b for b in range(1, 9) if runs_fused("heads_per_gpu", b, 8, 2048)] == [4, 8]
    assert [b for b in (2, 4) if runs_fused("heads_per_gpu", b, 12, 2048)] == [4]
    assert [h for h in (16, 26, 32) if runs_fused("heads_per_gpu", 2, h, 2048)] == [16, 32]
    # the check as megatron-core has it: any b * np divisible by 4 at 2048 tokens
    assert all(runs_fused("key_length", b, 8, 2048) for b in range(1, 9))
    assert not runs_fused("key_length", 1, 26, 2048)
    assert runs_fused(None, 1, 26, 2048)


HEADS, SEQ, MBS, TP = 64, 2048, 2, 8


def _splits(mbs: int = MBS) -> tuple[Split, Split]:
    return tuple(Split(tp=TP, cp=1, sp=False, mbs=mbs, flash=False, softmax_check=check)
                 for check in ("key_length", "heads_per_gpu"))


def test_the_fallback_moves_32_more_bytes_per_score_each_way():
    gpu = get_gpu("a100-sxm4-80gb")
    profile = compute_profile("a100-sxm4-80gb")
    fused, eager = _splits()
    layer = attention_layer(SEQ, HEADS, dropout=0.1)
    (f_fwd, f_bwd), (e_fwd, e_bwd) = (attention_time(layer, s, gpu, 312e12, profile)
                                      for s in (fused, eager))
    # forward: 2+4, 4+4, 4+4, 4+4, 4+2 = 36 bytes against the kernel's 2+2;
    # backward: 2+4, 4+4+4, 4+4, 4+4, 4+2 = 40 against the 8 priced for the kernel
    elements = HEADS / TP * SEQ * SEQ * MBS
    per_byte = elements / gpu.memory_bandwidth_Bps / profile.memory_efficiency
    assert e_fwd - f_fwd == pytest.approx((36 - 4) * per_byte, rel=1e-9)
    assert e_bwd - f_bwd == pytest.approx((40 - 8) * per_byte, rel=1e-9)
    # at micro-batch 4 both checks take the kernel
    assert attention_time(layer, _splits(4)[0], gpu, 312e12, profile) == \
        attention_time(layer, _splits(4)[1], gpu, 312e12, profile)


@pytest.mark.parametrize(("dropout", "extra"), [(0.1, 2), (0.0, 4)])
def test_the_fallback_keeps_fp32_probabilities(dropout, extra):
    # softmax's backward keeps its fp32 output (4) where the kernel keeps a 16-bit one (2);
    # without dropout the second batched GEMM keeps the 16-bit downcast besides (2)
    fused, eager = _splits()
    layer = attention_layer(SEQ, HEADS, dropout=dropout)
    kept = [layer_activation_bytes(layer, s, Recompute.NONE) for s in (fused, eager)]
    assert kept[1] - kept[0] == extra * HEADS / TP * SEQ * SEQ * MBS


def test_the_fallback_issues_four_more_kernels_each_way():
    runtime = runtime_with(runtime_profile("deepspeed"), {"launch_blocking": True})
    fused, eager = _splits()
    layer = attention_layer(SEQ, HEADS, dropout=0.1)
    delays = [layer_host_delay_s(runtime, layer, s, Recompute.NONE, 0.0) for s in (fused, eager)]
    # 4 + 4 more kernels, each 12 us of host time and a 5.8 us completion round trip
    assert delays[1] - delays[0] == pytest.approx(8 * (12e-6 + 5.8e-6), rel=1e-9)


def test_an_unknown_check_is_refused():
    with pytest.raises(ConstraintError, match="fused_softmax_check"):
        runtime_with(runtime_profile("megatron"), {"fused_softmax_check": "batch"})
