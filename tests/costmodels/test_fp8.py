"""FP8 training as Transformer Engine runs it: the saved bytes of a block counted by hand from
TE's linear.py / layernorm_linear.py, the GEMM rate against the datasheet's FP8 / BF16 peaks,
the casts per Linear, the cached FP8 weights, and a clear refusal on GPUs without FP8."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.compute import Split, gemm_time, layer_time, linear_time
from autoplan.costmodels import fp8
from autoplan.costmodels.fp8 import cast_bytes, linear_rate, weight_workspace_bytes
from autoplan.costmodels.profiles import compute_profile
from autoplan.costmodels.saved_activations import te_block_saved
from autoplan.errors import ConstraintError
from autoplan.graph.layer_graph import Attention, Gemm, LayerKind, ModelDims, TpSplit
from autoplan.plan import Recompute

LLAMA3_8B = ModelDims(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=128256, seq_len=8192, gated_mlp=True,
                      rmsnorm=True, rotary=True, linear_bias=False)
ATTENTION = Attention(num_heads=32, num_kv_heads=8, head_dim=128, seq_len=8192, causal=True,
                      dropout=0.0, fwd_flops=0.0, bwd_flops=0.0)
H100 = "h100-sxm5-80gb"


def test_fp8_block_keeps_its_gemm_inputs_in_one_byte():
    saved = te_block_saved(LLAMA3_8B, ATTENTION, b=2, gemm_input_bytes=1)
    # h 4096, 32 x 128 heads, 8 KV heads, F 14336, RMSNorm, no dropout, FP8 (TE 2.x):
    # hidden width: 2 LayerNormLinears x (norm input h*2 + FP8 ln_out h*1 + fp32 rsigma 4)
    #   = 2 * (8192 + 4096 + 4) = 24584 (bf16: 32776)
    # TP-sharded: q and the flash output 2 * 4096 * 2 = 16384, linear_proj's FP8 copy of the
    #   output 4096 * 1, k and v 2 * 1024 * 2 = 4096, bias-SwiGLU's input 2F * 2 = 57344, fc2's
    #   FP8 input F * 1 = 14336: 96256 (bf16: 106496)
    assert (saved.sharded, saved.replicated, saved.attention_internal) == (96256, 24584, 128)


def test_fp8_gemm_runs_at_the_datasheet_ratio_on_a_large_square_gemm():
    gpu, profile = get_gpu(H100), compute_profile(H100)
    bf16 = gemm_time(8192, 8192, 8192, gpu, gpu.bf16_flops, profile)
    fp8 = gemm_time(8192, 8192, 8192, gpu, gpu.fp8_flops, profile, operand_bytes=1)
    # NVIDIA H100 SXM datasheet, dense: 989 TFLOP/s BF16, 1979 TFLOP/s FP8
    assert fp8 / bf16 == pytest.approx(989 / 1979, rel=1e-3)


def _te_benchmark_gemms() -> list[tuple[int, int, int]]:
    """(M, K, N) of the GEMMs Transformer Engine's benchmarks/gemm/benchmark_gemm.py times for
    its model config (hidden 4096, FFN 16384, micro-batch 31 x sequence 512 = 15,872 tokens):
    the four forward GEMMs (QKV, attention out, MLP up, MLP down) counted twice (its Dgrad is
    "approximated as equal to Fprop" by default) and the four weight-gradient shapes
    (in-features x tokens x out-features)."""
    tokens, h, f = 31 * 512, 4096, 16384
    fprop = [(tokens, h, 3 * h), (tokens, h, h), (tokens, h, f), (tokens, f, h)]
    return fprop + fprop + [(k, tokens, n) for _, k, n in fprop]


def test_fp8_gemms_of_a_layer_match_transformer_engines_own_benchmark_on_hopper(llama_graph):
    # TE's docs (features/low_precision_training/speedups.rst), the benchmark above on an
    # H200: "FP8 DelayedScaling delivers ~1.69x over BF16" with each GEMM's operands quantized
    # as it runs (a te.Linear forward: cast-transposes of its input and weight, fast
    # accumulation), and "in pre-quantized mode, raw FP8 reaches 1.92x over BF16".
    block = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    name = "h200-sxm-141gb"
    gpu, profile = get_gpu(name), compute_profile(name)
    rate = linear_rate(block, gpu, "fp8", profile)
    bf16 = fp8_gemms = casts = 0.0
    for m, k, n in _te_benchmark_gemms():
        bf16 += gemm_time(m, n, k, gpu, gpu.bf16_flops, profile)
        fp8_gemms += gemm_time(m, n, k, gpu, rate.forward_peak, profile, operand_bytes=1)
        gemm = Gemm("linear", in_features=k, out_features=n, split=TpSplit.COLUMN)
        casts += cast_bytes([(gemm, m, k, n)], tp=1, casts_weights=True)[0]
    casts /= gpu.memory_bandwidth_Bps * profile.memory_efficiency
    assert bf16 / fp8_gemms == pytest.approx(1.92, rel=0.01)
    # the casts come from TE's quantizers (costmodels.fp8), not from this figure; the
    # benchmark ran on an H200 NVL, whose lower clocks leave the casts a smaller share
    assert bf16 / (fp8_gemms + casts) == pytest.approx(1.69, rel=0.03)


def test_transformer_engines_backward_fp8_gemms_run_with_the_split_accumulator(llama_graph):
    block = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    split = Split(tp=1, cp=1, sp=False, mbs=64)

    def backward_over_forward(name: str, precision: str) -> float:
        gpu, profile = get_gpu(name), compute_profile(name)
        rate = linear_rate(block, gpu, precision, profile)
        forward = sum(linear_time(g, split, gpu, rate.forward_peak, profile, rate.operand_bytes)
                      for g in block.gemms)
        times = layer_time(block, split, Recompute.NONE, gpu=gpu, precision=precision,
                           profile=profile)
        return times.wgrad_s / forward

    # torchao's FP8 backward GEMMs ran 1.1x to 1.2x faster with fast accumulation (pytorch/ao
    # issue 2377); the weight-gradient GEMMs are the forward's size: as long, at 16 bits
    assert 1.1 <= backward_over_forward(H100, "fp8") <= 1.2
    assert backward_over_forward(H100, "bf16") == pytest.approx(1.0, rel=1e-9)
    # Blackwell has no fast-accumulation mode (TE PR 2748: "no fastAccuMode for sm100")
    assert backward_over_forward("b200", "fp8") == pytest.approx(1.0, rel=1e-9)


def test_casts_are_an_input_and_a_gradient_cast_transpose_per_linear():
    fc1 = Gemm("fc1", in_features=4096, out_features=16384, split=TpSplit.COLUMN)
    rows, k, n = 8192, 4096, 16384 / 8  # TP 8
    fwd, bwd = cast_bytes([(fc1, rows, k, n)], tp=8, casts_weights=True)
    # TE quantize with row-wise and column-wise usage: read 2 bytes, write 1 + 1, of the
    # input (rows x k) and of the local weight (k x n); backward: the output gradient (rows x n)
    assert fwd == 4 * (8192 * 4096 + 4096 * 2048)
    assert bwd == 4 * 8192 * 2048


def test_cached_fp8_weights_are_two_bytes_per_block_linear_weight(llama_graph):
    block = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    # the conftest Llama: h 256, 8 heads of 32, 2 KV heads, F 896: q 256^2, k and v 256 x 64,
    # o 256^2, gate and up 256 x 896, down 896 x 256 = 851,968 weights; row-wise + column-wise
    assert weight_workspace_bytes(block, 1, "fp8", cached=True) == 2 * 851968
    assert weight_workspace_bytes(block, 1, "fp8", cached=False) == 0
    assert weight_workspace_bytes(block, 1, "bf16", cached=True) == 0


def test_fp8_speeds_a_blocks_gemms_but_not_its_attention(llama_graph):
    block = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    gpu, profile = get_gpu(H100), compute_profile(H100)
    split = Split(tp=1, cp=1, sp=False, mbs=64)
    times = {p: layer_time(block, split, Recompute.NONE, gpu=gpu, precision=p, profile=profile)
             for p in ("bf16", "fp8")}
    assert times["fp8"].attention_fwd_s == times["bf16"].attention_fwd_s
    assert times["fp8"].column_gemm_s < times["bf16"].column_gemm_s
    assert times["fp8"].wgrad_s < times["bf16"].wgrad_s


def test_fp8_on_a100_is_refused_with_what_to_change(examples):
    model = examples / "models" / "tiny_gpt.py"
    cluster = examples / "clusters" / "dgx-a100-x1.yaml"
    with pytest.raises(ConstraintError, match="no FP8 tensor cores"):
        api.estimate(model, cluster, {"tp": 1, "pp": 1, "dp": 8, "mbs": 1}, seq_len=256,
                     global_batch=16, precision="fp8")
    result = CliRunner().invoke(app, ["estimate", str(model), str(cluster), "--dp", "8",
                                      "--seq-len", "256", "--global-batch", "16",
                                      "--precision", "fp8"])
    assert result.exit_code == 2
    assert "--precision bf16" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("zero", [0, 1])
def test_megatron_keeps_fp8_weight_copies_only_beside_16_bit_weights(examples, zero):
    model = examples / "models" / "tiny_gpt.py"
    cluster = examples / "clusters" / "dgx-h100-x4.yaml"
    weights = {p: api.estimate(model, cluster, {"tp": 1, "pp": 1, "dp": 32, "mbs": 1,
                                                "zero": zero}, seq_len=256, global_batch=32,
                               precision=p, runtime="megatron").estimate
               .memory_breakdown_gib["weights"] for p in ("bf16", "fp8")}
    # tiny_gpt: 4 blocks of 12 h^2 Linear weights at h 128 = 786,432; at ZeRO 0 TE caches an
    # FP8 copy and its transpose (2 bytes each); from ZeRO 1 they are FP8 parameters
    # (--fp8-param-gather: Float8Tensor data and transpose, 2 bytes, as the bf16 weight)
    extra = 2 * 4 * 12 * 128**2 / 2**30 if zero == 0 else 0.0
    assert weights["fp8"] - weights["bf16"] == pytest.approx(extra, abs=1e-9)


def test_layernorm_linear_inputs_need_no_cast_of_their_own(llama_graph):
    block = next(layer for layer in llama_graph.layers if layer.kind is LayerKind.BLOCK)
    # the conftest Llama's Linears reading a norm: wq, wk, wv (attention_norm) and w1, w3
    # (ffn_norm); Megatron's LayerNormColumnParallelLinear writes their FP8 input itself
    assert {name.rsplit(".", 1)[1] for name in fp8.norm_fed(block.gemms)} == {
        "wq", "wk", "wv", "w1", "w3"}
    rows, h, f = 64, 256, 896
    shapes = [(g, rows, g.in_features, g.out_features) for g in block.gemms]
    fwd, _ = fp8.cast_bytes(shapes, tp=1, casts_weights=False,
                            fused_norm_inputs=fp8.norm_fed(block.gemms))
    # left: wo's input (h wide) and w2's (F wide), 4 bytes an element each
    assert fwd == 4 * rows * (h + f)


def test_fp8_with_megatrons_local_layers_is_refused_at_estimate(examples):
    with pytest.raises(ConstraintError, match="Transformer Engine"):
        api.estimate(examples / "models" / "tiny_gpt.py", examples / "clusters" / "dgx-h100-x4.yaml",
                     {"tp": 1, "pp": 1, "dp": 32, "mbs": 1}, seq_len=256, global_batch=32,
                     precision="fp8", runtime="megatron",
                     runtime_settings={"transformer_impl": "local"})


def test_fp8_mfu_is_against_the_fp8_peak(examples):
    result = api.estimate(examples / "models" / "tiny_gpt.py",
                          examples / "clusters" / "dgx-h100-x4.yaml",
                          {"tp": 1, "pp": 1, "dp": 32, "mbs": 1}, seq_len=256, global_batch=32,
                          precision="fp8", runtime="megatron").estimate
    # llm-foundry's FP8 rows state MFU against the H100's 1979 TFLOP/s dense FP8 peak
    assert result.mfu == pytest.approx(result.model_tflops_per_gpu / 1979, rel=1e-3)
