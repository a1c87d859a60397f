"""Attention priced by kernel and sequence length, checked against the published figures of
Shah et al. 2024, "FlashAttention-3" (arXiv 2407.08608), H100 80GB SXM5, BF16, head dim 128:
Figure 5 (forward, causal and not) and Figure 6 (backward, no causal mask), TFLOP/s with
causal FLOPs counted as half the dense ones (flash-attn's benchmark_flash_attention.py); and
what torchtitan's op-level selective checkpointing reruns in backward, from its policy."""

import math
import types
from pathlib import Path

import pytest

import autoplan
from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import (Split, attention_rate, attention_time,
                                         best_attention_fraction, gemm_time, layer_time)
from autoplan.costmodels.profiles import compute_profile
from autoplan.graph.layer_graph import Gemm, Layer, LayerKind, TpSplit
from autoplan.errors import AutoplanError
from autoplan.plan import Recompute
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.costmodels.layers import attention_layer

H100_PEAK = 989e12
# (kernel, seq): (causal forward, forward, backward) as printed in the paper's figures
PUBLISHED = {
    ("flash2", 512): (191, 309, 214), ("flash2", 2048): (298, 362, 291),
    ("flash2", 16384): (335, 370, 322),
    ("cudnn", 1024): (410, 574, 408), ("cudnn", 8192): (529, 600, 518),
    ("flash3", 4096): (579, 638, 542), ("flash3", 16384): (616, 648, 561),
}


@pytest.mark.parametrize(("kernel", "seq"), sorted(PUBLISHED))
def test_rates_are_the_published_ones(kernel, seq):
    causal_fwd, fwd, bwd = PUBLISHED[(kernel, seq)]
    profile = compute_profile("h100-sxm5-80gb")
    dense = attention_rate(profile, H100_PEAK, kernel, seq, causal=False)
    assert [r / 1e12 for r in dense] == pytest.approx([fwd, bwd], rel=1e-3)
    masked = attention_rate(profile, H100_PEAK, kernel, seq, causal=True)
    # the causal backward loses what the causal forward loses at that length
    assert [r / 1e12 for r in masked] == pytest.approx([causal_fwd, bwd * causal_fwd / fwd],
                                                       rel=1e-3)


def test_between_and_beyond_the_benchmarked_lengths():
    profile = compute_profile("h100-sxm5-80gb")
    # 3,000 tokens: log2(3000/2048) = 0.5508 of the way from 298 (2k) to 319 (4k) = 309.57
    fwd, _ = attention_rate(profile, H100_PEAK, "flash2", 3000, causal=True)
    assert fwd / 1e12 == pytest.approx(298 + math.log2(3000 / 2048) * 21, rel=1e-3)
    # the tables plateau by 16k: 64k runs at the 16k rate, 256 tokens at the 512 one
    assert attention_rate(profile, H100_PEAK, "flash2", 65536, True)[0] / 1e12 == \
        pytest.approx(335, rel=1e-3)
    assert attention_rate(profile, H100_PEAK, "flash2", 256, True)[0] / 1e12 == \
        pytest.approx(191, rel=1e-3)


def test_a_gpu_without_a_table_keeps_one_efficiency():
    assert attention_rate(compute_profile("a100-sxm4-80gb"), 312e12, "flash2", 4096, True) is None


def test_time_of_a_causal_call_by_hand():
    gpu = get_gpu("h100-sxm5-80gb")
    profile = compute_profile("h100-sxm5-80gb")
    layer = attention_layer(16384)
    dense = 4.0 * 16 * 16384**2 * 128
    fwd, bwd = attention_time(layer, Split(tp=1, cp=1, sp=False, mbs=1), gpu, H100_PEAK, profile)
    # half the dense FLOPs at 335 TFLOP/s forward; 2.5x them at 322 * 335 / 370 backward
    assert fwd == pytest.approx(0.5 * dense / 335e12, rel=1e-3)
    assert bwd == pytest.approx(2.5 * 0.5 * dense / (322e12 * 335 / 370), rel=1e-3)
    # with CP 2 each GPU computes half the sample's scores in 8k-token chunks: the 8k rate
    fwd_cp, _ = attention_time(layer, Split(tp=1, cp=2, sp=False, mbs=1), gpu, H100_PEAK,
                               profile)
    assert fwd_cp == pytest.approx(0.5 * 0.5 * dense / 333e12, rel=1e-3)
    fast, _ = attention_time(layer, Split(tp=1, cp=1, sp=False, mbs=1, kernel="flash3"), gpu,
                             H100_PEAK, profile)
    assert fast == pytest.approx(0.5 * dense / 616e12, rel=1e-3)


def test_the_bound_allows_the_fastest_dense_equivalent_rate():
    # a causal call does half the dense FLOPs: flash3's 648 TFLOP/s is 1296 dense-equivalent
    profile = compute_profile("h100-sxm5-80gb")
    assert best_attention_fraction(profile, H100_PEAK, "flash3") * H100_PEAK / 1e12 == \
        pytest.approx(2 * 648, rel=1e-3)


def _llama_block(tokens: int = 4096) -> Layer:
    """A Llama-3-8B-shaped block: wq, wk, wv, wo, w1, w3, w2 in forward order."""
    h, kv, f = 4096, 1024, 14336
    gemms = tuple(Gemm(name, k, n, TpSplit.NONE, rows=tokens) for name, k, n in (
        ("wq", h, h), ("wk", h, kv), ("wv", h, kv), ("wo", h, h), ("w1", h, f), ("w3", h, f),
        ("w2", f, h)))
    att = attention_layer(tokens, heads=32).attention
    return Layer(name="block", kind=LayerKind.BLOCK, num_params=0, params_sharded=0,
                 param_bytes=0, fwd_flops=0.0, bwd_flops=0.0, activation_bytes_sharded=0.0,
                 activation_bytes_replicated=0.0, attention_internal_bytes=0.0,
                 elementwise_bytes_sharded=1e9, elementwise_bytes_replicated=0.0,
                 boundary_bytes=0.0, input_bytes=0.0, gemms=gemms, attention=att)


def test_op_sac_reruns_every_second_matmul_and_the_memory_bound_ops():
    # torchtitan SelectiveAC (distributed/activation_checkpoint.py): mm_count counts the
    # block's matmuls in forward order and every even one is PREFER_RECOMPUTE, as is every op
    # outside the save list; SDPA is saved. Of wq, wk, wv, wo, w1, w3, w2: wk, wo, w3.
    gpu, profile = get_gpu("h100-sxm5-80gb"), compute_profile("h100-sxm5-80gb")
    layer = _llama_block()
    split = Split(tp=1, cp=1, sp=False, mbs=1)
    t = layer_time(layer, split, Recompute.SELECTIVE, gpu=gpu, precision="bf16",
                   profile=profile, op_sac=True)
    rerun = sum(gemm_time(4096, n, k, gpu, H100_PEAK, profile)
                for k, n in ((4096, 1024), (4096, 4096), (4096, 14336)))
    memory_bound = 1e9 / (gpu.memory_bandwidth_Bps * profile.memory_efficiency)
    assert t.recompute_s == pytest.approx(rerun + memory_bound)
    # Megatron's selective recompute reruns core attention only
    megatron = layer_time(layer, split, Recompute.SELECTIVE, gpu=gpu, precision="bf16",
                          profile=profile)
    assert megatron.recompute_s == pytest.approx(megatron.attention_fwd_s)


LONG_HEADS = LlamaConfig(num_layers=2, hidden_size=256, num_heads=2, num_kv_heads=2,
                         ffn_hidden_size=512, vocab_size=256)  # head dim 128
_model = types.ModuleType("long_heads")
_model.build_model = lambda: Llama(LONG_HEADS)
_model.loss = next_token_loss
H100_NODES = Path(__file__).parents[2] / "examples" / "clusters" / "dgx-h100-x4.yaml"


def _step(**settings) -> float:
    """The step's GPU side: this hidden-256 model's blocks are host-bound (costmodels/host.py),
    so their kernels are priced without the host."""
    return autoplan.estimate(_model, H100_NODES, {"dp": 32, "mbs": 1}, seq_len=8192,
                             global_batch=32, runtime="fsdp",
                             runtime_settings={"block_forward_kernels": 0, **settings}
                             ).estimate.step_time_s


def test_a_runtime_setting_chooses_the_kernel():
    # flash3's causal 8k forward runs 602 TFLOP/s against flash2's 333: the step is shorter
    assert _step(attention_kernel="flash3") < _step(attention_kernel="cudnn") < _step()
    with pytest.raises(AutoplanError, match="attention_kernel 'flash4'.*flash2, cudnn, flash3"):
        _step(attention_kernel="flash4")


def test_triton_flash_attention_runs_at_half_flash2():
    # flash_attn_triton.py's docstring: its forward + backward is "slightly slower" than
    # FlashAttention (1)'s CUDA kernels; FlashAttention-2 is "around 2x" FlashAttention (Dao
    # 2023, abstract): half flash2's published rate, here 335 / 2 causal forward at 16k on
    # H100, and half of A100's one efficiency (no table there), causal tiles skipped alike.
    h100, a100 = compute_profile("h100-sxm5-80gb"), compute_profile("a100-sxm4-80gb")
    fwd, bwd = attention_rate(h100, H100_PEAK, "triton", 16384, causal=True)
    assert fwd / 1e12 == pytest.approx(335 / 2, rel=1e-3)
    assert bwd / 1e12 == pytest.approx(322 * 335 / 370 / 2, rel=1e-3)
    layer = attention_layer(4096)
    for gpu, profile, peak in ((get_gpu("h100-sxm5-80gb"), h100, H100_PEAK),
                               (get_gpu("a100-sxm4-80gb"), a100, 312e12)):
        flash2 = attention_time(layer, Split(tp=1, cp=1, sp=False, mbs=1), gpu, peak, profile)
        triton = attention_time(layer, Split(tp=1, cp=1, sp=False, mbs=1, kernel="triton"),
                                gpu, peak, profile)
        assert triton == pytest.approx(tuple(2 * t for t in flash2), rel=1e-9)
