"""TP backward overlap and ZeRO-3 collectives, worked by hand from the communication primitives
(tests/cluster/test_comm.py checks those against nccl-tests figures)."""

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, runtime_with, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm
from autoplan.costmodels.compute import Split, column_gemm_time
from autoplan.costmodels.step import estimate
from autoplan.errors import ConstraintError
from autoplan.graph.layer_graph import LayerKind
from autoplan.plan import Recompute
from autoplan.training import Pins
from published_runs import _gpt_module, selene

L, H, A, V, S = 2, 12288, 96, 51200, 1024  # a GPT whose GEMMs outlast its TP messages
TP, MBS = 8, 8


@pytest.fixture(scope="module")
def megatron():
    model = load_model(_gpt_module(L, H, A, V, S))
    cluster = load_cluster(selene(8))
    return make_problem(model, cluster, training_spec(S, 4 * MBS, "bf16", "megatron", "flash"))


def _tp_comm(problem, *, overlap: bool, sp: bool = False, recompute=Recompute.NONE) -> float:
    problem = problem.__class__(**{**{f: getattr(problem, f) for f in (
        "graph", "cluster", "training", "compute", "mem_limit_bytes")},
        "runtime": runtime_with(problem.runtime, {"tp_bwd_overlap": overlap})})
    plan = plan_from_pins(problem, Pins(tp=TP, pp=1, dp=1, mbs=MBS, sp=sp, recompute=recompute))
    return estimate(problem, plan).time_breakdown_s["tp_comm"]


def _all_reduce(problem) -> float:
    """One all-reduce of a micro-batch's hidden states (s*b*h bf16) over the node's TP group."""
    return comm.all_reduce_time(2 * S * MBS * H, group_links(problem.cluster, TP, 1))


def test_column_gemms_are_long_enough_to_hide_the_gradient_all_reduces(megatron):
    # Precondition of the tests below: each column-parallel Linear's GEMM outlasts its
    # all-reduce, so with overlap none of the backward's is exposed.
    block = next(l for l in megatron.graph.layers if l.kind is LayerKind.BLOCK)
    peak = megatron.cluster.gpu.peak_flops("bf16")
    window = column_gemm_time(block, Split(TP, 1, False, MBS), megatron.cluster.gpu, peak,
                              megatron.compute)
    assert window > 2 * _all_reduce(megatron)


def test_async_tp_all_reduce_leaves_only_the_forward_exposed(megatron):
    # Per micro-batch (4 of them): forward 2 all-reduces per block + 1 for the vocab-parallel
    # embedding; backward 2 per block (column-parallel input gradients) + 1 for the head.
    m, ar = 4, _all_reduce(megatron)
    assert _tp_comm(megatron, overlap=False) == pytest.approx(m * (4 * L + 2) * ar, rel=1e-9)
    assert _tp_comm(megatron, overlap=True) == pytest.approx(m * (2 * L + 1) * ar, rel=1e-9)


def test_full_recompute_keeps_the_overlap(megatron):
    # Korthikanti et al. 2022 Table 4: full recompute adds one forward (with its all-reduces)
    # to the backward, which hides its gradient all-reduces as before.
    m, ar = 4, _all_reduce(megatron)
    assert _tp_comm(megatron, overlap=True, recompute=Recompute.FULL) == pytest.approx(
        m * (4 * L + 1) * ar, rel=1e-9)


def test_sequence_parallel_exposes_the_output_gradient_gathers(megatron):
    # With SP the forward of a block runs, per row-parallel Linear, a reduce-scatter of its
    # output and the next column-parallel Linear's all-gather (2 of each per block), the
    # vocab-parallel embedding one reduce-scatter (megatron-core
    # reduce_scatter_to_sequence_parallel_region), the output layer one all-gather of its
    # input; in backward each row-parallel Linear all-gathers its output gradient (2 per
    # block), and the column-parallel gathers and reduce-scatters (the head's included) hide
    # under their GEMMs.
    m = 4
    links = group_links(megatron.cluster, TP, 1)
    gather = comm.all_gather_time(2 * S * MBS * H, links)
    scatter = comm.reduce_scatter_time(2 * S * MBS * H, links)
    assert _tp_comm(megatron, overlap=True, sp=True) == pytest.approx(
        m * (2 * L * (gather + scatter) + scatter + gather + 2 * L * gather), rel=1e-9)


def test_sequence_parallel_across_nodes_pays_two_rings_not_a_tree():
    # TP 16 over two p5 nodes (EFA), 32 MiB of activations: NCCL can run the all-reduce as a
    # tree (2 network steps) but SP's all-gather and reduce-scatter only as rings (NCCL's
    # tuner has no tree for either), each with one network step at EFA's 75 us (twice for
    # Simple) and its own launch: the pair costs more than the all-reduce it replaces.
    cluster = load_cluster({"name": "p5", "preset": "dgx-h100", "nodes": 2, "inter_node": {
        "link": "efa", "nics_per_node": 32, "bandwidth": "100Gbps"}}).cluster
    links = group_links(cluster, 16, 1)
    message = 32 * 2**20
    pair = comm.all_gather_time(message, links) + comm.reduce_scatter_time(message, links)
    assert pair > comm.all_reduce_time(message, links)


def test_unknown_runtime_settings_are_refused(megatron):
    with pytest.raises(ConstraintError, match="tp_overlap_bwd"):
        runtime_with(megatron.runtime, {"tp_overlap_bwd": True})


def test_ring_latency_is_one_hop_per_step():
    # 64 GPUs on 8 nodes: a ring reduce-scatter's 63 steps, 7 of them across the network at
    # NCCL's hwLat[NET][ring][Simple] = 14 us, the other 56 at NVLink's 3.4 us (tuning.cc):
    # 56 * 3.4 + 7 * 14 = 288.4 us beyond the launch floor. Inside a node, 7 NVLink hops of 1 us.
    cluster = load_cluster(selene(64)).cluster
    assert comm.ring_latency(group_links(cluster, 64, 1)) == pytest.approx(288.4e-6)
    assert comm.ring_latency(group_links(cluster, 8, 1)) == pytest.approx(7 * 1e-6)


def test_deepspeed_zero3_without_prefetch_pays_one_ring_per_module_and_pass():
    # With stage3_prefetch_bucket_size 0 DeepSpeed gathers each parameter-owning module by its
    # own call (fetch_sub_module): a GPT block has 6 (ln_1, c_attn, attention c_proj, ln_2,
    # c_fc, MLP c_proj), the embedding 2 (wte, wpe), ln_f 1, the tied head none. Each is
    # gathered twice (forward, backward) and, priced the same way, its gradients
    # reduce-scattered once: 3 rings of 15 steps (16 GPUs on 2 nodes) per module. (With the
    # default prefetch, the calls DeepSpeed issues: tests/costmodels/test_zero3_calls.py.)
    model = load_model(_gpt_module(L, 1024, 16, 1024, 256))
    cluster = load_cluster(selene(16))
    modules = 6 * L + 2 + 1
    times = {}
    for runtime in ("deepspeed", "fsdp"):
        problem = make_problem(model, cluster, training_spec(256, 16, "bf16", runtime, "flash"),
                               runtime_settings={"zero3_collective_efficiency": 1.0,
                                                 "zero3_overlap": 0.0, "reduce_bytes": 2,
                                                 "unshard_copy_bytes": 0,
                                                 "zero3_prefetch_bucket_params": 0})
        plan = plan_from_pins(problem, Pins(tp=1, pp=1, dp=16, mbs=1, zero=3))
        times[runtime] = estimate(problem, plan).time_breakdown_s["dp_comm"]
    # FSDP gathers a layer at once: embedding, 2 blocks, ln_f (the head has no own weights).
    fsdp_units = 1 + L + 1
    # a ring over 16 GPUs on 2 nodes: 15 steps, 1 over the network at 14 us and 14 over
    # NVLink at 3.4 us (NCCL tuning.cc, Simple): 61.6 us
    hop_latency = 14 * 3.4e-6 + 14e-6
    assert times["deepspeed"] - times["fsdp"] == pytest.approx(
        3 * (modules - fsdp_units) * hop_latency, rel=1e-6)
