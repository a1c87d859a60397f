"""Recomputing the first N blocks of each chunk (Megatron's --recompute-method block): worked by
hand from one block's costs, and chosen by the solver when memory is tight."""

import pytest

import autoplan
from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.costmodels.fused_kernels import block_traffic
from autoplan.costmodels.compute import Split, layer_time
from autoplan.costmodels.memory import layer_activation_bytes
from autoplan.costmodels.saved_activations import megatron_saved_layer
from autoplan.costmodels.step import estimate
from autoplan.costmodels.problem import memory_mib
from autoplan.graph.layer_graph import LayerKind
from autoplan.plan import Recompute
from autoplan.search.brute import brute_force
from autoplan.training import Pins

TINY = "examples/models/tiny_gpt.py"  # 4 identical blocks
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
SEQ, BATCH, MBS = 256, 16, 16
SHAPE = {"tp": 1, "pp": 1, "dp": 1, "mbs": MBS, "zero": 0}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


@pytest.fixture(scope="module")
def problem(examples):
    model = load_model(examples / "models/tiny_gpt.py")
    cluster = load_cluster(examples / "clusters/dgx-a100-x1.yaml")
    return make_problem(model, cluster, training_spec(SEQ, BATCH, "bf16", "megatron", "flash"))


@pytest.fixture(scope="module")
def gpu_side(examples):
    """The problem without the host side: the tiny blocks are host-bound (costmodels/host.py)."""
    model = load_model(examples / "models/tiny_gpt.py")
    cluster = load_cluster(examples / "clusters/dgx-a100-x1.yaml")
    return make_problem(model, cluster, training_spec(SEQ, BATCH, "bf16", "megatron", "flash"),
                        runtime_settings={"block_forward_kernels": 0})


def _estimate(problem, recompute, n=None):
    plan = plan_from_pins(problem, Pins(**SHAPE, recompute=recompute, recompute_num_layers=n))
    return estimate(problem, plan)


def test_each_recomputed_block_trades_its_activations_for_one_forward(gpu_side):
    problem = gpu_side
    traced = next(l for l in problem.graph.layers if l.kind is LayerKind.BLOCK)
    # the block as the megatron runtime's Transformer Engine layer saves it (saved_activations)
    block = megatron_saved_layer(problem.graph, traced, problem.runtime.transformer_impl, "bf16")
    split = Split(tp=1, cp=1, sp=False, mbs=MBS)
    # By hand: a recomputed block keeps only its input instead of everything it saves, and runs
    # its forward again in backward, once per micro-batch (one chunk, one micro-batch in flight).
    saved_gib = (layer_activation_bytes(block, split, Recompute.NONE)
                 - layer_activation_bytes(block, split, Recompute.FULL)) / 2**30
    kernels = block_traffic(problem.graph, block, problem.runtime.transformer_impl, "bf16")
    forward_s = layer_time(block, split, Recompute.NONE, gpu=problem.cluster.gpu,
                           precision="bf16", profile=problem.compute, kernels=kernels).fwd_s
    micro_batches = BATCH // MBS
    none, full = _estimate(problem, "none"), _estimate(problem, "full")
    blocks = len(problem.graph.block_indices())
    for n in range(1, blocks + 1):  # n = 0 is no recompute, n = all is full recompute
        partial = _estimate(problem, "full", n)
        assert partial.memory_breakdown_gib["activations"] == pytest.approx(
            none.memory_breakdown_gib["activations"] - n * saved_gib, rel=1e-9)
        assert partial.time_breakdown_s["compute"] == pytest.approx(
            none.time_breakdown_s["compute"] + n * micro_batches * forward_s, rel=1e-9)
    assert _estimate(problem, "full", blocks) == full


def test_recompute_num_layers_needs_full_recompute():
    with pytest.raises(ValueError, match="needs recompute = full"):
        autoplan.Plan(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1,
                      num_microbatches=1, world_size=1, recompute="selective",
                      recompute_num_layers=2, stages=[{"first_layer": 0, "num_layers": 8}])


def _tight_limit(problem) -> float:
    """A cap under which no and selective recompute do not fit but recomputing 3 of the 4 blocks
    does (each recomputed block frees well over a MiB here)."""
    three = _estimate(problem, "full", 3)
    selective = _estimate(problem, "selective")
    assert memory_mib(selective.peak_memory_gib * 2**30) > memory_mib(three.peak_memory_gib * 2**30)
    return memory_mib(three.peak_memory_gib * 2**30) * 2**20


def test_solver_recomputes_only_as_many_blocks_as_memory_needs(problem):
    limit = _tight_limit(problem)
    result = autoplan.solve(TINY, DGX1, seq_len=SEQ, global_batch=BATCH, pins=SHAPE,
                            mem_limit=limit, headroom=0)  # the limit itself, as the brute force
    plan = result.plan
    assert plan.recompute is Recompute.FULL and plan.recompute_num_layers == 3
    assert result.estimate.step_time_s < _estimate(problem, "full").step_time_s
    # The brute force over the same space agrees (the partial rows are not in the pruned group).
    tight = make_problem(load_model(TINY), load_cluster(DGX1),
                         training_spec(SEQ, BATCH, "bf16", "megatron", "flash"), limit)
    best, est = brute_force(tight, Pins(**SHAPE))
    assert round(est.step_time_s * 1e6) == round(result.estimate.step_time_s * 1e6)
    assert best.recompute_num_layers == 3


def test_pinned_recompute_num_layers_is_kept():
    result = autoplan.solve(TINY, DGX1, seq_len=SEQ, global_batch=BATCH,
                            pins={**SHAPE, "recompute_num_layers": 2})
    assert (result.plan.recompute, result.plan.recompute_num_layers) == (Recompute.FULL, 2)
