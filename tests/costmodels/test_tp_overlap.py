"""Transformer Engine's userbuffers TP overlap (--tp-comm-overlap): the chunk schedules against a
step-by-step simulation of the two CUDA streams as csrc/comm_gemm_overlap.h (TE 1.8) orders
them, and a block's exposed TP time worked by hand from the communication primitives and the
GEMM model (tests/costmodels/test_gemm_shapes.py checks that against cuBLAS figures)."""

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm, tp_overlap
from autoplan.costmodels.compute import Split, linear_time
from autoplan.costmodels.step import estimate
from autoplan.errors import ConstraintError
from autoplan.graph.layer_graph import LayerKind, TpSplit
from autoplan.problems import make_problem, runtime_with, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.training import Pins
from published_runs import _gpt_module, selene

L, H, A, V, S = 2, 12288, 96, 51200, 1024  # a GPT whose GEMMs outlast its TP messages
TP, MBS, M = 8, 8, 4  # 4 micro-batches


def _ring_by_streams(gather_s: float, gemm_s: float, tp: int) -> float:
    """UbufP2PCommOverlap::split_overlap_ag: chunk i's GEMM needs chunk i (its own at once, the
    others received); the copy engine forwards chunk i as soon as it has it, one send at a time."""
    chunk, hop = gemm_s / tp, gather_s / (tp - 1)
    have = [0.0]  # when each chunk is on this GPU
    for _ in range(tp - 1):
        have.append(have[-1] + hop)
    gemm_done = 0.0
    for arrived in have:
        gemm_done = max(gemm_done, arrived) + chunk
    return gemm_done


def _pipeline_by_streams(scatter_s: float, gemm_s: float, splits: int) -> float:
    """UbufCommOverlap::split_overlap_rs without SM sharing: the GEMM chunks back to back on the
    compute streams, chunk i's reduce-scatter on the comm stream after GEMM i and the previous
    reduce-scatter."""
    chunk, scatter = gemm_s / splits, scatter_s / splits
    comm_done = 0.0
    for i in range(splits):
        comm_done = max(comm_done, (i + 1) * chunk) + scatter
    return comm_done


@pytest.mark.parametrize("gather_s, gemm_s, tp", [
    (0.7e-3, 1.6e-3, 8), (1.4e-3, 0.8e-3, 8), (0.3e-3, 0.3e-3, 2), (2.0e-3, 1.0e-3, 4)])
def test_ring_exchange_matches_the_stream_schedule(gather_s, gemm_s, tp):
    assert tp_overlap.ring_exchange_s(gather_s, gemm_s, tp) == pytest.approx(
        _ring_by_streams(gather_s, gemm_s, tp), rel=1e-12)


def _aggregated_by_streams(gather_s: float, gemm_s: float, tp: int) -> float:
    """split_overlap_ag with ``_aggregate2``: one chunk swapped with the neighbour, then tp/2
    GEMMs of two chunks, each pair sent on to rank + 2 while its GEMM runs (two chunks' bytes
    per send, ``comm_bytes * 2``), the next GEMM waiting for the pair it receives."""
    chunk, hop = gemm_s / tp, gather_s / (tp - 1)
    have = [hop]  # the first pair: own chunk and the neighbour's
    for _ in range(tp // 2 - 1):
        have.append(have[-1] + 2 * hop)
    gemm_done = 0.0
    for arrived in have:
        gemm_done = max(gemm_done, arrived) + 2 * chunk
    return gemm_done


@pytest.mark.parametrize("gather_s, gemm_s, tp", [
    (0.7e-3, 1.6e-3, 8), (1.4e-3, 0.8e-3, 8), (2.0e-3, 1.0e-3, 4)])
def test_aggregated_ring_exchange_matches_the_stream_schedule(gather_s, gemm_s, tp):
    assert tp_overlap.ring_exchange_s(gather_s, gemm_s, tp, aggregate=True) == pytest.approx(
        _aggregated_by_streams(gather_s, gemm_s, tp), rel=1e-12)


@pytest.mark.parametrize("scatter_s, gemm_s", [
    (0.2e-3, 1.6e-3), (1.6e-3, 0.2e-3), (0.8e-3, 0.8e-3)])
def test_pipelined_reduce_scatter_matches_the_stream_schedule(scatter_s, gemm_s):
    no_sms = tp_overlap.OpSettings(num_sm=0)
    assert tp_overlap.pipelined_s(scatter_s, gemm_s, no_sms, 132) == pytest.approx(
        _pipeline_by_streams(scatter_s, gemm_s, 4), rel=1e-12)


def test_an_sm_driven_collective_costs_the_gemm_its_sms():
    # No margin: 16 of 132 SMs beside a 1 ms GEMM for 0.4 ms: 1 + 0.4 * 16/132 ms; a 3 ms
    # collective outlasts the slowed GEMM and sets the time. With set_sm_margin 1 the GEMM runs
    # on 132 - 24 = 108 SMs throughout: 1 ms * 132/108.
    default, margin = tp_overlap.OpSettings(), tp_overlap.OpSettings(num_sm=24, margin=True)
    assert tp_overlap.beside_s(0.4e-3, 1e-3, default, 132) == pytest.approx(
        1e-3 + 0.4e-3 * 16 / 132)
    assert tp_overlap.beside_s(3e-3, 1e-3, default, 132) == pytest.approx(3e-3)
    assert tp_overlap.beside_s(0.4e-3, 1e-3, margin, 132) == pytest.approx(1e-3 * 132 / 108)


def test_backward_regions_hide_under_the_backward_gemms_as_long_as_they_run():
    # One region on 132 SMs, TP 8, TE's defaults (16-SM bulk collectives, no margin): a 1 ms
    # all-gather and reduce-scatter; forward GEMMs of 0.9 ms, backward ones 1.2 ms (FP8's
    # split accumulator). Ring exchange of the output gradient under the row dgrad: 7 steps
    # of max(1.2/8, 1/7) = 0.15 ms plus the last chunk: 1.2 ms, nothing exposed; each bulk
    # collective beside a 1.2 ms column GEMM costs it 1 ms * 16/132.
    region = tp_overlap.Region(gather_s=1e-3, scatter_s=1e-3, column_s=0.9e-3, row_s=0.9e-3,
                               column_bwd_s=1.2e-3, row_bwd_s=1.2e-3,
                               names=tp_overlap.REGION_OPS[0])
    assert tp_overlap.exposed_backward_s(region, 8, (), 132) == pytest.approx(
        2 * 1e-3 * 16 / 132)
    # Were the backward GEMMs the forward's 0.9 ms: the ring's hops (1/7 ms) outlast its
    # chunks (0.1125 ms): 7/7 + 0.1125 - 0.9 ms exposed; each bulk collective slows its GEMM
    # by 0.9 ms * 16/132 to 1.009 ms, past the collective's 1 ms.
    short = tp_overlap.Region(1e-3, 1e-3, 0.9e-3, 0.9e-3, 0.9e-3, 0.9e-3, tp_overlap.REGION_OPS[0])
    assert tp_overlap.exposed_backward_s(short, 8, (), 132) == pytest.approx(
        (1.0 + 0.1125 - 0.9 + 2 * 0.9 * 16 / 132) * 1e-3)


def _problem(gpus: int, settings: dict):
    model = load_model(_gpt_module(L, H, A, V, S))
    return make_problem(model, load_cluster(selene(gpus)),
                        training_spec(S, M * MBS * gpus // TP, "bf16", "megatron", "flash"),
                        runtime_settings=settings)


def _tp_comm(problem, tp: int = TP) -> float:
    plan = plan_from_pins(problem, Pins(tp=tp, pp=1, dp=1, mbs=MBS, sp=True))
    return estimate(problem, plan).time_breakdown_s["tp_comm"]


@pytest.fixture(scope="module")
def problems():
    return _problem(TP, {}), _problem(TP, {"tp_comm_overlap": True})


def _region_gemms(problem):
    """(column, row) forward seconds of the block's attention and MLP regions: its Linears in
    order are qkv (column), proj (row), fc1 (column), fc2 (row)."""
    block = next(l for l in problem.graph.layers if l.kind is LayerKind.BLOCK)
    assert [g.split for g in block.gemms] == [TpSplit.COLUMN, TpSplit.ROW] * 2
    gpu, peak = problem.cluster.gpu, problem.cluster.gpu.peak_flops("bf16")
    times = [linear_time(g, Split(TP, 1, True, MBS), gpu, peak, problem.compute)
             for g in block.gemms]
    return [(times[0], times[1]), (times[2], times[3])]


def test_overlap_leaves_a_block_its_last_reduce_scatters_and_the_collectives_sms(problems):
    # Per micro-batch and region, from the primitives: g, s the all-gather and reduce-scatter
    # of the b*s*h bf16 activations over the node; the region's column and row GEMMs. The hops
    # (g/7) are shorter than an eighth of either GEMM and the scatter chunks (s/4) than a quarter
    # of the row GEMM, so the ring exchanges hide whole; forward: each of the first 3
    # reduce-scatter chunks takes 16/108 of an A100's SMs for its length beside the row GEMM,
    # then the last chunk runs alone; backward: the column Linear's two bulk collectives cost
    # their SM share for their length. Embedding and head keep their unoverlapped collectives
    # (not TE modules).
    plain, overlap = problems
    links = group_links(plain.cluster, TP, 1)
    g = comm.all_gather_time(2 * S * MBS * H, links)
    s = comm.reduce_scatter_time(2 * S * MBS * H, links)
    share = 16 / 108
    exposed = 0.0
    for col, row in _region_gemms(plain):
        assert g / 7 < min(col, row) / 8 and s / 4 < row / 4  # the preconditions above
        exposed += (3 * share * s / 4 + s / 4) + share * (g + s)
    unoverlapped = 2 * (g + s) + 2 * g  # test_overlap.py: SP's forward pairs, output-gradient gathers
    assert _tp_comm(overlap) == pytest.approx(
        _tp_comm(plain) + M * L * (exposed - unoverlapped), rel=1e-9)


def test_a_recipes_config_sets_each_ops_sms(problems):
    # NeMo's llama3.1_70b.yaml sets proj_fprop to 24 SMs with set_sm_margin 1: the attention
    # region's row GEMM runs on 108 - 24 = 84 SMs for its 4 chunks, the reduce-scatter chunks
    # beside it (all shorter), the last alone: row * 108/84 + s/4 - row more than the GEMM.
    plain = problems[0]
    cfg = {"proj_fprop": {"num_sm": 24, "set_sm_margin": 1, "num_splits": 4, "method": "pipeline",
                          "cga_size": 2}}
    tuned = _problem(TP, {"tp_comm_overlap": True, "tp_comm_overlap_cfg": cfg})
    s = comm.reduce_scatter_time(2 * S * MBS * H, group_links(plain.cluster, TP, 1))
    (_, row), _ = _region_gemms(plain)
    assert s / 4 < row / 4 * 108 / 84
    default_forward = 3 * 16 / 108 * s / 4 + s / 4
    assert _tp_comm(tuned) - _tp_comm(problems[1]) == pytest.approx(
        M * L * (row * 108 / 84 + s / 4 - row - default_forward), rel=1e-9)


def test_a_tp_group_across_nodes_is_not_overlapped():
    # Userbuffers reach one NVLink domain: TP 16 over two DGX A100 prices as without the flag.
    assert _tp_comm(_problem(16, {"tp_comm_overlap": True}), 16) == pytest.approx(
        _tp_comm(_problem(16, {}), 16), rel=1e-12)


def test_tp_comm_overlap_needs_transformer_engine(problems):
    with pytest.raises(ConstraintError, match="transformer_impl"):
        runtime_with(problems[0].runtime, {"tp_comm_overlap": True, "transformer_impl": "local"})


@pytest.mark.parametrize("cfg, message", [
    ({"qkv_fprop_x": {}}, "not an op"), ({"proj_fprop": {"method": "bulk"}}, "not priced"),
    ({"qkv_dgrad": {"num_sms": 4}}, "num_sms not known"), ("ring", "must map op names")])
def test_an_overlap_config_autoplan_cannot_price_is_refused(problems, cfg, message):
    with pytest.raises(ConstraintError, match=message):
        runtime_with(problems[0].runtime, {"tp_comm_overlap": True, "tp_comm_overlap_cfg": cfg})


def test_userbuffers_hold_a_buffer_per_overlapped_op_and_three_workspaces(problems):
    # TE 1.8 initialize_ub: 10 ops (4 ring exchanges, 2 pipelines, 4 bulk) each register a
    # buffer of the shape Megatron passes, [seq * mbs / cp, hidden] in bf16, allocated outside
    # PyTorch: 10 * 1024 * 8 * 12288 * 2 bytes; and TE's cuBLAS workspace repeated for its 3
    # GEMM streams through PyTorch: 3 * 4 MiB on an A100 (get_cublas_workspace_size_bytes).
    plain, overlap = problems
    estimates = [estimate(p, plan_from_pins(p, Pins(tp=TP, pp=1, dp=1, mbs=MBS, sp=True)))
                 for p in problems]
    gib = 2**30
    buffers, workspaces = 10 * S * MBS * H * 2, 3 * 4 * 2**20
    assert estimates[1].peak_memory_gib - estimates[0].peak_memory_gib == pytest.approx(
        (buffers + workspaces) / gib, rel=1e-6)
    assert estimates[1].peak_reserved_gib - estimates[0].peak_reserved_gib == pytest.approx(
        workspaces / gib, rel=1e-6)
