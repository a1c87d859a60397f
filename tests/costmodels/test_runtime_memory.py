"""Memory as each runtime allocates it: torchtitan's TP always with SP and its gathered
inputs, FSDP2 with PP keeping the stage unsharded, the allocator's reserved peak, and the
headroom solve keeps; expected values are hand counts from the frameworks' source."""

from __future__ import annotations

import pytest

import autoplan
from autoplan import api
from autoplan.costmodels.compute import Split
from autoplan.costmodels.memory import layer_activation_bytes
from autoplan.errors import ConstraintError
from autoplan.plan import Recompute
from autoplan.units import GIB
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.graph.models import LLAMA_GQA, llama_gqa, model_file

SEQ, BATCH = 64, 8
CONTEXT = 1.5 * GIB  # profiles.yaml cuda_context_bytes, every runtime
CUBLAS = 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)  # A100: torch's :4096:2:16:8 workspace for the
# forward's and for autograd's backward thread's cuBLAS handle (CublasHandlePool.cpp)


def _estimate(examples, pins, runtime="fsdp", cluster="dgx-a100-x1.yaml"):
    return autoplan.estimate(llama_gqa, examples / "clusters" / cluster, pins, seq_len=SEQ,
                             global_batch=BATCH, runtime=runtime)


def test_fsdp_prices_tp_with_sequence_parallelism(examples):
    """torchtitan's parallelize plan has no TP without SP: the plan says so and is priced so,
    and --no-sp is refused with the reason."""
    implied = _estimate(examples, {"tp": 2, "dp": 4})
    pinned = _estimate(examples, {"tp": 2, "dp": 4, "sp": True})
    assert implied.plan.sequence_parallel
    assert implied.estimate.peak_memory_gib == pinned.estimate.peak_memory_gib
    with pytest.raises(ConstraintError, match="always applies sequence parallelism"):
        _estimate(examples, {"tp": 2, "dp": 4, "sp": False})


def test_traced_column_inputs_are_the_two_normed_streams():
    """The column-parallel Linears read the attention-norm output (wq, wk, wv) and the
    ffn-norm output (w1, w3): two [s, h] bf16 tensors per sample."""
    graph = autoplan.load_model(llama_gqa).trace(SEQ, "bf16")
    block = graph.layers[graph.block_indices()[0]]
    assert block.column_input_bytes == 2 * 2 * SEQ * LLAMA_GQA.hidden_size


def test_torchtitan_sp_keeps_the_gathered_column_inputs():
    """Without recompute, torchtitan's SP at TP 2 keeps a block's two gathered [s, h] inputs
    whole where Megatron's SP keeps half of each: 2 x 2 s h x (1 - 1/2) bytes more per sample,
    times mbs 2."""
    graph = autoplan.load_model(llama_gqa).trace(SEQ, "bf16")
    block = graph.layers[graph.block_indices()[0]]
    split = Split(tp=2, cp=1, sp=True, mbs=2)
    whole = layer_activation_bytes(block, split, Recompute.NONE, gathered_inputs=True)
    shard = layer_activation_bytes(block, split, Recompute.NONE)
    assert whole - shard == 2 * 2 * SEQ * LLAMA_GQA.hidden_size * (1 - 1 / 2) * 2


def test_reserved_is_allocated_plus_the_allocators_slack(examples):
    """peak = reserved + what lies outside the allocator (CUDA context, NCCL); reserved =
    allocated + the cuBLAS workspace + 10% of activations (profiles.yaml fragmentation)."""
    e = _estimate(examples, {"dp": 8}, runtime="megatron").estimate
    assert (e.peak_memory_gib - e.peak_reserved_gib) * GIB == pytest.approx(CONTEXT)
    slack = CUBLAS + 0.10 * e.memory_breakdown_gib["activations"] * GIB
    assert (e.peak_reserved_gib - e.peak_allocated_gib) * GIB == pytest.approx(slack)


def test_fsdp_with_pp_keeps_the_stage_unsharded(examples):
    """torchtitan with PP: no reshard after forward and gradient sync only on the last
    micro-batch, so each stage holds its parameters in bf16 (2) and their gradients in the
    fp32 reduce dtype (4) unsharded: with PP 2 the ZeRO-3 buffer becomes 6 bytes per
    parameter of the stage instead of 10 per parameter of its largest block."""
    result = _estimate(examples, {"pp": 2, "dp": 4, "zero": 3, "mbs": 1})
    e, plan = result.estimate, result.plan
    graph = autoplan.load_model(llama_gqa).trace(SEQ, "bf16")
    worst = e.stage_memory_gib.index(max(e.stage_memory_gib))
    stage = plan.stages[worst]
    params = sum(l.num_params for l in graph.layers[stage.first_layer:
                                                     stage.first_layer + stage.num_layers])
    allowance = CONTEXT + CUBLAS + 0.10 * e.memory_breakdown_gib["activations"] * GIB
    assert e.memory_breakdown_gib["other"] * GIB == pytest.approx(allowance + 6 * params)


def test_solve_keeps_a_default_headroom_and_estimate_does_not(examples):
    """solve plans against 95% of the limit (DEFAULT_HEADROOM 0.05), --headroom 0 against all
    of it; estimate judges against the GPU's own 80 GiB."""
    cluster = examples / "clusters/dgx-a100-x1.yaml"
    kept = autoplan.solve(llama_gqa, cluster, seq_len=SEQ, global_batch=BATCH, mem_limit="8GiB")
    full = autoplan.solve(llama_gqa, cluster, seq_len=SEQ, global_batch=BATCH, mem_limit="8GiB",
                          headroom=0)
    assert kept.estimate.memory_limit_gib == pytest.approx(8 * 0.95)
    assert full.estimate.memory_limit_gib == pytest.approx(8)
    assert _estimate(examples, {"dp": 8}).estimate.memory_limit_gib == pytest.approx(80)
    with pytest.raises(ConstraintError, match="headroom 1.5"):
        autoplan.solve(llama_gqa, cluster, seq_len=SEQ, global_batch=BATCH, headroom=1.5)


def test_options_file_sets_the_headroom(examples):
    result = autoplan.solve(llama_gqa, examples / "clusters/dgx-a100-x1.yaml", seq_len=SEQ,
                            global_batch=BATCH, mem_limit="8GiB", options={"headroom": 0.2})
    assert result.estimate.memory_limit_gib == pytest.approx(8 * 0.8)


def test_explain_names_the_moment_that_sets_the_peak(examples):
    """With a 32768-token vocabulary at 64 tokens the cross-entropy's 12 bytes per logit
    (25 MB) outweigh a block's backward (well under 1 MB): explain says the loss sets the
    peak; the small-vocabulary model peaks in a block's backward."""
    big = LlamaConfig(num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2,
                      ffn_hidden_size=176, vocab_size=32768)
    wide = model_file("llama_wide_vocab", lambda: Llama(big), loss=next_token_loss)
    cluster = examples / "clusters/dgx-a100-x1.yaml"
    for model, moment in ((wide, "the loss"), (llama_gqa, "the backward of a block")):
        result = autoplan.solve(model, cluster, seq_len=SEQ, global_batch=BATCH,
                                pins={"dp": 8, "recompute": "none"})
        assert f"its peak during {moment}" in api.explain(result, model).binding
