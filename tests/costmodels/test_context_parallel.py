"""Context parallelism (ring attention) against formulas worked by hand."""

import pytest

import autoplan
from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm
from autoplan.costmodels.compute import Split, attention_time
from autoplan.costmodels.context import kv_block_bytes
from autoplan.costmodels.memory import layer_activation_bytes
from autoplan.costmodels.step import estimate
from autoplan.errors import ConstraintError, InfeasibleError
from autoplan.graph.layer_graph import LayerKind
from autoplan.plan import Recompute
from autoplan.search.space import check_pins, cp_options, shapes
from autoplan.training import AttentionKernel, Pins, Runtime, TrainingSpec
from published_runs import _gpt_module, selene

L, H, A, S = 2, 1024, 16, 8192  # head_dim 64, 16 KV heads (MHA)


@pytest.fixture(scope="module")
def model():
    return load_model(_gpt_module(L, H, A, 1024, S))


def _problem(model, cluster, runtime="megatron"):
    return make_problem(model, load_cluster(cluster), training_spec(S, 16, "bf16", runtime, "flash"))


def _block(problem):
    return next(l for l in problem.graph.layers if l.kind is LayerKind.BLOCK)


def test_kv_block_is_the_local_keys_and_values(model):
    # 2 (K, V) x 8192/4 tokens x 16/2 heads x 64 x 2 bytes = 4 MiB per micro-batch.
    block = _block(_problem(model, selene(8)))
    assert kv_block_bytes(block, Split(tp=2, cp=4, sp=False, mbs=1)) == 2 * 2048 * 8 * 64 * 2


def test_activations_divide_by_cp(model):
    # Each GPU keeps the activations of s/cp tokens (flash attention: no s x s term).
    block = _block(_problem(model, selene(8)))
    whole = layer_activation_bytes(block, Split(1, 1, False, 1), Recompute.NONE)
    assert layer_activation_bytes(block, Split(1, 4, False, 1), Recompute.NONE) == pytest.approx(
        whole / 4)


def test_ring_transfers_hide_under_long_attention_on_nvlink(model):
    # 4096 tokens per GPU: each step's attention (~(s/cp)^2) outlasts the KV block (~s/cp).
    problem = _problem(model, selene(8))
    plan = plan_from_pins(problem, Pins(tp=1, pp=1, cp=2, dp=4, mbs=4))
    assert estimate(problem, plan).time_breakdown_s["cp_comm"] == 0.0


def test_ring_transfers_over_pcie_are_exposed_step_by_step(model, examples):
    # A ring of cp=4 GPUs on PCIe (32 GB/s): 3 transfers per layer; the forward sends K,V, the
    # backward K,V and dK,dV; each step hides what its attention (1/cp of the GPU's) covers.
    problem = _problem(model, examples / "clusters/pcie-x2-10gbe.yaml")
    plan = plan_from_pins(problem, Pins(tp=1, pp=1, cp=4, dp=1, mbs=1))
    block, cp = _block(problem), 4
    split = Split(1, cp, False, 1)
    links = group_links(problem.cluster, cp, 1)
    kv = 2 * (S // cp) * A * (H // A) * 2
    fwd, bwd = attention_time(block, split, problem.cluster.gpu, problem.cluster.gpu.peak_flops(
        "bf16"), problem.compute)
    per_layer = (cp - 1) * (comm.p2p_time(kv, links) - fwd / cp + comm.p2p_time(2 * kv, links)
                            - bwd / cp)
    assert comm.p2p_time(kv, links) > fwd / cp  # the precondition: transfers are exposed
    assert estimate(problem, plan).time_breakdown_s["cp_comm"] == pytest.approx(
        plan.num_microbatches * L * per_layer, rel=1e-9)


def test_gradients_and_zero_shards_span_dp_times_cp(model):
    # DP and CP ranks hold the same weights: the distributed optimizer shards its 12 bytes per
    # parameter over dp*cp = 8 GPUs (Megatron's data-parallel group with CP).
    problem = _problem(model, selene(8))
    plan = plan_from_pins(problem, Pins(tp=1, pp=1, cp=4, dp=2, mbs=1, zero=1))
    optimizer = estimate(problem, plan).memory_breakdown_gib["optimizer"] * 2**30
    assert optimizer == pytest.approx(12 * problem.graph.num_params / 8, rel=1e-6)


def _training_spec(seq_len, runtime=Runtime.MEGATRON, attention=AttentionKernel.FLASH):
    return TrainingSpec(seq_len=seq_len, global_batch=16, runtime=runtime, attention=attention)


def test_cp_is_searched_for_long_sequences_only():
    # At least 4096 tokens per GPU and a sequence cut into 2*cp equal chunks.
    assert cp_options(_training_spec(4096), None) == [1]
    assert cp_options(_training_spec(8192), None) == [1, 2]
    assert cp_options(_training_spec(131072), None) == [1, 2, 4, 8, 16, 32]
    assert cp_options(_training_spec(8192, Runtime.DEEPSPEED), None) == [1]
    assert cp_options(_training_spec(8192, attention=AttentionKernel.EXPLICIT), None) == [1]


def test_the_search_space_holds_cp_shapes(model):
    graph = _problem(model, selene(8)).graph
    found = shapes(graph, world=64, gpus_per_node=8, training=_training_spec(S), pins=Pins())
    assert {s.cp for s in found} == {1, 2}
    assert all(s.tp * s.pp * s.dp * s.cp <= 64 for s in found)


@pytest.mark.parametrize("training, message", [
    (_training_spec(8192, Runtime.DEEPSPEED), "DeepSpeed has no ring-attention context "
                                              "parallelism; Megatron-LM and FSDP do"),
    (_training_spec(8192, attention=AttentionKernel.EXPLICIT), "flash attention"),
    (_training_spec(8190), "2\\*cp = 4"),
])
def test_cp_pins_the_runtime_cannot_run_are_refused(model, training, message):
    graph = _problem(model, selene(8)).graph
    # A runtime without CP is infeasible (exit 3), a kernel or length without it bad input.
    with pytest.raises(InfeasibleError if "DeepSpeed" in message else ConstraintError,
                       match=message):
        check_pins(graph, world=8, training=training, pins=Pins(cp=2))


def test_solve_may_choose_cp(model):
    result = autoplan.solve(model, selene(16), seq_len=S, global_batch=16, pins={"cp": 2})
    assert result.plan.cp == 2 and result.plan.world_size <= 16
