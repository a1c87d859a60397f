"""Memory model against published formulas worked by hand (data/README.md sec. 3)."""

import dataclasses
import types

import pytest

import autoplan

from autoplan.costmodels.compute import Split
from autoplan.costmodels.memory import layer_activation_bytes, model_state_bytes
from autoplan.costmodels.profiles import runtime_profile
from autoplan.graph.layer_graph import LayerKind
from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
from autoplan.plan import Offload, Recompute
from autoplan.zoo import GPT, GPTConfig, next_token_loss
from autoplan.problems import make_problem, training_spec
from tests.extras import require

DEEPSPEED = runtime_profile("deepspeed")
MEGATRON = runtime_profile("megatron")
# The ZeRO paper's accounting (README 3.4): fp16 weights and grads, K = 12 of fp32 state.
PAPER = dataclasses.replace(DEEPSPEED, grad_bytes=2, fp32_grad_bytes=0, master_bytes=4,
                            moment_bytes=8)


def states(psi, zero, dp, runtime=PAPER, offload=Offload.NONE):
    return model_state_bytes(psi, zero_stage=zero, dp=dp, offload=offload, runtime=runtime).total


def test_mixed_precision_adam_keeps_16_bytes_per_parameter():
    # README 3.4: (2 + 2 + K) * psi with K = 12.
    assert states(1e9, zero=0, dp=8) == pytest.approx(16e9)


@pytest.mark.parametrize("zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_stages_match_the_zero_paper_table(zero, expected_gb):
    # README 3.4 table: 7.5B parameters, N_d = 64 (Rajbhandari et al. 2020, Figure 1).
    assert states(7.5e9, zero=zero, dp=64) / 1e9 == pytest.approx(expected_gb, rel=0.01)


def test_megatron_keeps_fp32_main_grads():
    # Megatron-LM docs: 18 bytes/param without, 6 + 12/d with the distributed optimizer.
    assert states(1e9, zero=0, dp=8, runtime=MEGATRON) == pytest.approx(18e9)
    assert states(1e9, zero=1, dp=8, runtime=MEGATRON) == pytest.approx((6 + 12 / 8) * 1e9)


def test_offloaded_optimizer_leaves_weights_and_grads():
    assert states(1e9, zero=1, dp=8, offload=Offload.OPTIMIZER) == pytest.approx(4e9)


S, H, A = 512, 1024, 16  # seq, hidden, heads of the traced block


@pytest.fixture(scope="module")
def block():
    module = types.ModuleType("gpt_block_test")
    config = GPTConfig(num_layers=2, hidden_size=H, num_heads=A, vocab_size=1024, max_seq_len=S)
    module.build_model = lambda: GPT(config)
    module.loss = next_token_loss
    graph = trace_model(load_model_source(module), seq_len=S)
    return next(l for l in graph.layers if l.kind is LayerKind.BLOCK)


def korthikanti(t, *, sp, selective):
    """Korthikanti et al. 2022, Table 2: bytes per layer per sample, explicit attention."""
    scores = 0 if selective else 5 * A * S / (H * t)
    if sp:
        return S * H * (34 / t + scores)
    return S * H * (10 + 24 / t + scores)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.SELECTIVE])
def test_activation_bytes_per_layer_match_korthikanti_table_2(block, t, sp, recompute):
    split = Split(tp=t, cp=1, sp=sp, mbs=1, flash=False)
    expected = korthikanti(t, sp=sp, selective=recompute is Recompute.SELECTIVE)
    # The trace also sees LayerNorm's fp32 mean and rstd (8 bytes per token, 2 norms), which
    # the paper's count leaves out: 0.5% of the smallest case here.
    assert layer_activation_bytes(block, split, recompute) == pytest.approx(expected, rel=0.006)


def test_full_recompute_keeps_only_the_layer_input(block):
    # Korthikanti et al. 2022 sec. 5: 2sbh per layer; with SP the input is split by t.
    assert layer_activation_bytes(block, Split(8, 1, False, 1), Recompute.FULL) == 2 * S * H
    assert layer_activation_bytes(block, Split(8, 1, True, 1), Recompute.FULL) == 2 * S * H / 8


def test_flash_attention_keeps_no_score_matrix(block):
    explicit = layer_activation_bytes(block, Split(1, 1, False, 1, flash=False), Recompute.NONE)
    flash = layer_activation_bytes(block, Split(1, 1, False, 1, flash=True), Recompute.NONE)
    assert explicit - flash == pytest.approx(5 * A * S * S, rel=0.01)


@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_deepspeed_zero2_matches_deepspeeds_own_estimator(gpus):
    stage_1_and_2 = require("deepspeed.runtime.zero.stage_1_and_2")
    psi = 7_000_000_000
    _, expected = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        psi, num_gpus_per_node=min(gpus, 8), num_nodes=max(1, gpus // 8), cpu_offload=False)
    assert states(psi, zero=2, dp=gpus, runtime=DEEPSPEED) == pytest.approx(expected, abs=1)


@pytest.mark.parametrize("gpus", [8, 64])
def test_deepspeed_zero3_matches_deepspeeds_own_estimator(gpus):
    stage3 = require("deepspeed.runtime.zero.stage3")
    psi, largest = 7_000_000_000, 200_000_000
    _, expected, _ = stage3.estimate_zero3_model_states_mem_needs(
        psi, largest, num_gpus_per_node=8, num_nodes=gpus // 8, cpu_offload=False)
    # DeepSpeed counts its largest layer (the largest parameter-owning module, see the test
    # below) at 4 bytes/param, weights and gradient; our memory model puts the same 2 x 2
    # bytes in "other". Its 18/N leaves out the fp16 parameter partition ZeRO-3 keeps on every
    # GPU (2/N): we count 20/N, on purpose.
    ours = states(psi, zero=3, dp=gpus, runtime=DEEPSPEED) + 2 * 2 * largest
    assert ours == pytest.approx(expected + 2 * psi / gpus, abs=1)


def test_traced_largest_module_is_deepspeeds_largest_layer(block):
    stage3 = require("deepspeed.runtime.zero.stage3")
    config = GPTConfig(num_layers=2, hidden_size=H, num_heads=A, vocab_size=1024, max_seq_len=S)
    _, largest = stage3.model_to_params(GPT(config).h[0])
    assert block.largest_module_params == largest == 4 * H * H + 4 * H  # the MLP's c_fc


def test_zero3_memory_holds_the_gathered_unit_of_each_runtime(examples):
    # DeepSpeed: the largest module (c_fc, 4h^2 + 4h) at 4 bytes/param (weights and gradient,
    # its estimator); FSDP2: a whole block (12h^2 + 13h) at 10 bytes/param: running and
    # prefetched bf16 parameters (2 + 2), the block's bf16 gradient (2) and its fp32 copy for
    # the reduce-scatter (torchtitan's mixed_precision_reduce = "float32": 4). DeepSpeed also
    # allocates its reduce bucket whole: reduce_bucket_size 5e8 elements x 2 bytes.
    # h = 1024, ZeRO-3 over 8 GPUs of one node.
    h = 1024
    module = types.ModuleType("gpt_zero3_test")
    config = GPTConfig(num_layers=2, hidden_size=h, num_heads=16, vocab_size=1024, max_seq_len=256)
    module.build_model = lambda: GPT(config)
    module.loss = next_token_loss
    other = {}
    for runtime in ("deepspeed", "fsdp"):
        result = autoplan.estimate(module, examples / "clusters/dgx-a100-x1.yaml",
                                   {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "zero": 3}, seq_len=256,
                                   global_batch=8, runtime=runtime)
        breakdown = result.estimate.memory_breakdown_gib
        other[runtime] = breakdown["other"] - 0.10 * breakdown["activations"]  # less fragmentation
    assert (other["fsdp"] - other["deepspeed"]) * 2**30 == pytest.approx(
        (2 + 2 + 2 + 4) * (12 * h * h + 13 * h) - 4 * (4 * h * h + 4 * h) - 5e8 * 2, rel=1e-6)


def test_the_530b_zero3_run_fits_the_80gb_gpus_it_ran_on(examples, monkeypatch):
    # published_runs.csv row N21-T2-04: ZeRO-3, MBS 4, on 640 A100-80GB (it did not fit on 560).
    from published_runs import published_runs
    monkeypatch.chdir(examples.parent)
    run = next(r for r in published_runs() if r.row_id == "N21-T2-04")
    result = autoplan.estimate(run.model, run.cluster, run.pins, seq_len=run.seq_len,
                               global_batch=run.global_batch, runtime=run.runtime,
                               precision=run.precision, attention="explicit")
    assert result.estimate.feasible


@pytest.mark.parametrize("layout,copies", [
    # pp=2: embedding + 2 blocks | 2 blocks, norm, head, loss: the last rank keeps the copy.
    ([3, 5], {0: 0, 1: 1}),
    # pp=3 with the loss alone on the last stage: the copy is on the rank running the head.
    ([3, 4, 1], {0: 0, 1: 1, 2: 0}),
    # pp=2, two chunks each, head in chunk 2 (rank 0, with the embedding): one shared table.
    ([3, 2, 2, 1], {0: 0, 1: 0}),
])
def test_tied_head_copy_sits_on_the_rank_that_runs_the_head(layout, copies):
    """tiny_gpt ties its LM head (vocab 1024 x hidden 128 = 131,072 weights) to the embedding:
    with the two on different pipeline ranks, Megatron keeps a copy on the head's rank."""
    from autoplan.costmodels.placement import plan_links
    from autoplan.costmodels.ranks import rank_cost
    from autoplan.plan import Plan, Stage

    model = autoplan.load_model("examples/models/tiny_gpt.py")
    problem = make_problem(model, autoplan.load_cluster("examples/clusters/dgx-a100-x1.yaml"),
                           training_spec(64, 8, "bf16", "megatron", "flash"))
    vpp = 2 if len(layout) == 4 else 1
    pp = len(layout) // vpp
    starts = [sum(layout[:i]) for i in range(len(layout))]
    plan = Plan(tp=1, pp=pp, dp=1, micro_batch_size=1, global_batch_size=8, num_microbatches=8,
                world_size=pp, vpp=vpp, stages=tuple(Stage(first_layer=s, num_layers=n)
                                                   for s, n in zip(starts, layout)))
    layers = problem.graph.layers
    for rank, copy in copies.items():
        chunks = [(s, n) for c, (s, n) in enumerate(zip(starts, layout)) if c % pp == rank]
        own = sum(layers[i].num_params for s, n in chunks for i in range(s, s + n))
        cost = rank_cost(problem, plan, rank, plan_links(problem, plan))
        assert cost.params == own + copy * 1024 * 128
