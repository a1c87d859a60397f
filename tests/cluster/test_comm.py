"""Collective times on placed groups, checked against hand-worked formulas and nccl-tests figures."""

from __future__ import annotations

import pytest

from autoplan.api import load_cluster
from autoplan.errors import ClusterSpecError
from autoplan.cluster.profile import load_nccl_profile
from autoplan.cluster.topology import GroupLinks, group_links
from autoplan.costmodels import comm

GIB = 2**30


def _node(gpu: str, bandwidth: str, nodes: int = 1, **inter) -> dict:
    spec = {"gpu": gpu, "nodes": nodes, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": bandwidth}}
    if nodes > 1:
        spec["inter_node"] = {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps",
                              **inter}
    return spec


def _cluster(spec: dict):
    return load_cluster(spec).cluster


def _busbw(size: int, message: float, seconds: float) -> float:
    return 2 * (size - 1) / size * message / seconds


def _switch(n: int, bw: float) -> GroupLinks:
    """n GPUs on one ideal switch: full efficiency, no hop latency."""
    return GroupLinks(size=n, members_per_node=n, num_nodes=1, intra_bandwidth=bw,
                      intra_efficiency=1.0, intra_latency=0.0, nic_bandwidth_per_gpu=0.0,
                      inter_efficiency=1.0, inter_latency=0.0, gpus_per_node=n)


def test_ring_all_reduce_on_one_switch_is_2_n_minus_1_over_n_size_over_bw():
    # Hand-worked: 8 GPUs, 4 GiB, 100 GB/s: 2*7/8 * 4 GiB / 100 GB/s = 75.16 ms (+ launch floor).
    # 4 GiB at 100 GB/s sits past the size curve's plateau (it scales sizes by 480/100).
    t = comm.all_reduce_time(4 * GIB, _switch(8, 100e9), algorithm="ring")
    assert t - comm.NCCL_BASE_LATENCY_S == pytest.approx(2 * 7 / 8 * 4 * GIB / 100e9, rel=1e-9)
    assert t == pytest.approx(0.07516, rel=1e-3)
    rs = comm.reduce_scatter_time(4 * GIB, _switch(8, 100e9), algorithm="ring")
    assert rs - comm.NCCL_BASE_LATENCY_S == pytest.approx(7 / 8 * 4 * GIB / 100e9, rel=1e-9)


def test_tp_group_inside_an_nvswitch_node_is_bound_by_nvlink():
    one, many = _cluster(_node("a100-sxm4-80gb", "300GB/s")), _cluster(
        _node("a100-sxm4-80gb", "300GB/s", nodes=16))
    for cluster in (one, many):
        links = group_links(cluster, 8, 1)
        assert not links.crosses_nodes
        assert comm.bus_bandwidth(links) == pytest.approx(300e9 * 0.7)  # NVLink3 x plateau efficiency


def test_dp_group_across_nodes_is_bound_by_the_nic_share_of_each_gpu():
    # 8 HDR NICs per node shared by 8 GPUs: 25 GB/s each; one member per node (TP=8 inside).
    cluster = _cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=4))
    links = group_links(cluster, 4, 8)
    assert (links.members_per_node, links.num_nodes) == (1, 4)
    assert comm.bus_bandwidth(links) == pytest.approx(25e9 * 0.92)
    # One 200 Gb/s NIC for the whole node: each GPU's DP ring gets 1/8 of it.
    thin = _cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=4, nics_per_node=1))
    assert comm.bus_bandwidth(group_links(thin, 4, 8)) == pytest.approx(25e9 / 8 * 0.92)
    # Whole-node groups get all the node's NICs: 8 x 25 GB/s, below NVLink's 210.
    assert comm.bus_bandwidth(group_links(cluster, 32, 1)) == pytest.approx(200e9 * 0.92)


def test_oversubscription_slows_cross_leaf_groups_by_its_factor():
    def cluster(ratio: str):
        return _cluster({**_node("a100-sxm4-80gb", "300GB/s", nodes=8),
                         "fabric": {"kind": "fat-tree", "oversubscription": ratio, "nodes_per_leaf": 4}})

    flat, thin = cluster("1:1"), cluster("2:1")
    across = group_links(thin, 8, 8)  # one GPU on each of 8 nodes: 2 leaves
    inside = group_links(thin, 4, 8)  # 4 nodes: one leaf
    assert across.num_leaves == 2 and inside.num_leaves == 1
    assert comm.bus_bandwidth(group_links(flat, 8, 8)) / comm.bus_bandwidth(across) == pytest.approx(2.0)
    assert comm.bus_bandwidth(inside) == comm.bus_bandwidth(group_links(flat, 4, 8))
    ratio = comm.all_reduce_time(4 * GIB, across) / comm.all_reduce_time(4 * GIB, group_links(flat, 8, 8))
    assert 1.9 < ratio <= 2.0  # the launch floor is not slowed


# README sec. 4.2 (nccl-tests all_reduce_perf busbw): DGX H100 single node, dgxc-benchmarking
# nccl README: 466 GB/s at 1 GB (and 67/237/401/480 at 1 MB/16 MB/128 MB/8 GB); A100 SXM4 single
# 8-GPU NVSwitch node about 200 GB/s (nccl-tests issue 149); 3 A100 nodes with 4 HDR HCAs each
# 85 GB/s average, 96 peak (nccl-tests issue 119).
@pytest.mark.parametrize("gpu, bandwidth, published", [
    ("h100-sxm5-80gb", "450GB/s", 466e9),
    ("a100-sxm4-80gb", "300GB/s", 200e9),
])
def test_one_node_all_reduce_busbw_at_1gb_is_within_10_percent_of_nccl_tests(gpu, bandwidth, published):
    links = group_links(_cluster(_node(gpu, bandwidth)), 8, 1)
    predicted = _busbw(8, GIB, comm.all_reduce_time(GIB, links))
    assert predicted == pytest.approx(published, rel=0.10)


@pytest.mark.parametrize("size, published", [(2**20, 67e9), (2**24, 237e9), (2**27, 401e9),
                                             (2**33, 480e9)])
def test_dgx_h100_busbw_curve_follows_nccl_tests(size, published):
    links = group_links(_cluster(_node("h100-sxm5-80gb", "450GB/s")), 8, 1)
    assert _busbw(8, size, comm.all_reduce_time(size, links)) == pytest.approx(published, rel=0.10)


def test_three_a100_nodes_with_four_hdr_hcas_reach_85_to_96_gbs():
    cluster = _cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=3, nics_per_node=4))
    predicted = _busbw(24, GIB, comm.all_reduce_time(GIB, group_links(cluster, 24, 1)))
    assert 85e9 <= predicted <= 96e9


def test_small_messages_pay_the_latency_floor():
    links = group_links(_cluster(_node("h100-sxm5-80gb", "450GB/s")), 8, 1)
    assert 13e-6 <= comm.all_reduce_time(8, links) <= 17e-6  # README 4.2: 13-17 us at 8 B-2 KB


def test_tree_beats_ring_latency_at_scale_and_auto_takes_the_faster():
    links = group_links(_cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=64)), 512, 1)
    ring = comm.all_reduce_time(2**16, links, algorithm="ring")
    tree = comm.all_reduce_time(2**16, links, algorithm="tree")
    assert tree < ring
    assert comm.all_reduce_time(2**16, links) == min(ring, tree)
    with pytest.raises(ValueError, match="algorithm"):
        comm.all_reduce_time(1.0, links, algorithm="butterfly")


def test_hierarchical_all_reduce_moves_a_kth_of_the_data_over_the_network():
    links = group_links(_cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=4)), 32, 1)
    t = comm.all_reduce_time(8 * GIB, links, algorithm="hierarchical")
    intra = 2 * 7 / 8 * 8 * GIB / (300e9 * 0.7)
    inter = 2 * 3 / 4 * GIB / (25e9 * 0.92)  # 8 GiB / 8 GPUs per node over each GPU's NIC
    assert t == pytest.approx(intra + inter, rel=0.05)


def test_all_to_all_inside_a_node_and_across_nodes():
    node = _cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=2))
    inside = comm.all_to_all_time(8 * GIB, group_links(node, 8, 1))
    # 7/8 of 8 GiB over NVLink at 210 GB/s (chunks of 1 GiB are on the plateau).
    assert inside == pytest.approx(7 / 8 * 8 * GIB / 210e9, rel=0.05)
    across = comm.all_to_all_time(8 * GIB, group_links(node, 16, 1))
    # Half of it leaves the node through the GPU's 25 GB/s NIC share: the network sets the pace.
    assert across == pytest.approx(8 / 16 * 8 * GIB / (25e9 * 0.92), rel=0.05)


def test_p2p_across_nodes_uses_one_gpus_nic_share():
    links = group_links(_cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=2)), 2, 8)
    t = comm.p2p_time(4 * GIB, links)
    assert t == pytest.approx(4 * GIB / (25e9 * 0.92), rel=0.01)


def test_a_measured_profile_replaces_the_model(tmp_path):
    profile = load_nccl_profile({"intra_node": {"1MiB": "50GB/s", "1GiB": "150GB/s"},
                                 "inter_node": {"1GiB": "80GB/s"}})
    cluster = _cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=2))
    tp = group_links(cluster, 8, 1, profile=profile)
    assert _busbw(8, GIB, comm.all_reduce_time(GIB, tp)) == pytest.approx(150e9)
    # Between points: linear in log size; 32 MiB is halfway from 1 MiB to 1 GiB.
    assert _busbw(8, 2**25, comm.all_reduce_time(2**25, tp)) == pytest.approx(100e9)
    # Below the smallest point the time stays that of the smallest (latency-bound).
    assert comm.all_reduce_time(1024, tp) == pytest.approx(comm.all_reduce_time(2**20, tp))
    # Whole-node measurement; a DP group with one GPU per node gets 1/8 of it.
    dp = group_links(cluster, 2, 8, profile=profile)
    assert _busbw(2, GIB, comm.all_reduce_time(GIB, dp)) == pytest.approx(80e9 / 8)


def test_cluster_yaml_names_a_profile_file_relative_to_itself(tmp_path):
    (tmp_path / "measured.yaml").write_text(
        "source: all_reduce_perf on our node\nintra_node:\n  1GiB: 120GB/s\n")
    (tmp_path / "cluster.yaml").write_text(
        "gpu: a100-sxm4-80gb\nnodes: 1\ngpus_per_node: 8\nintra_node: {link: nvswitch}\n"
        "nccl_profile: measured.yaml\n")
    cluster = _cluster(tmp_path / "cluster.yaml")
    assert cluster.nccl_profile.source == "all_reduce_perf on our node"
    links = group_links(cluster, 8, 1)
    assert _busbw(8, GIB, comm.all_reduce_time(GIB, links)) == pytest.approx(120e9)


def test_profile_by_node_count_interpolates_in_log_nodes():
    # nccl-tests busbw measured on 2 and 16 whole nodes: 90 and 60 GB/s at 1 GiB. A 4-node ring
    # is a third of the way from 2 to 16 in log(nodes): 90 - 30/3 = 80 GB/s; 32 nodes are past
    # the largest table and keep its 60; a 2-node ring reads its own table.
    profile = load_nccl_profile({"inter_node": {2: {"1GiB": "90GB/s"}, 16: {"1GiB": "60GB/s"}}})
    for nodes, busbw in ((2, 90e9), (4, 80e9), (16, 60e9), (32, 60e9)):
        cluster = _cluster(_node("h100-sxm5-80gb", "450GB/s", nodes=nodes))
        dp = group_links(cluster, nodes, 8, profile=profile)  # one GPU per node: 1/8 of the NICs
        assert _busbw(nodes, GIB, comm.all_reduce_time(GIB, dp)) == pytest.approx(busbw / 8)


def test_flat_inter_node_table_holds_for_any_node_count():
    profile = load_nccl_profile({"inter_node": {"1GiB": "80GB/s"}})
    for nodes in (2, 64):
        cluster = _cluster(_node("a100-sxm4-80gb", "300GB/s", nodes=nodes))
        dp = group_links(cluster, nodes, 8, profile=profile)
        assert _busbw(nodes, GIB, comm.all_reduce_time(GIB, dp)) == pytest.approx(80e9 / 8)


@pytest.mark.parametrize("table", [{1: {"1GiB": "90GB/s"}}, {"two": {"1GiB": "90GB/s"}},
                                   {2: {"1GiB": "90GB/s"}, 4: "80GB/s"}])
def test_bad_node_keyed_tables_are_refused_with_the_form_to_use(table):
    with pytest.raises(ClusterSpecError, match=r"keyed by node count.*2: \{1MiB"):
        load_nccl_profile({"inter_node": table})


def test_node_keyed_profile_survives_the_plan_json_round_trip():
    # model_dump(mode="json") writes the node counts as strings: they read back the same.
    as_json = {"inter_node": {"2": {"1GiB": "90GB/s"}, "16": {"1GiB": "60GB/s"}}}
    assert load_nccl_profile(as_json) == load_nccl_profile(
        {"inter_node": {2: {"1GiB": "90GB/s"}, 16: {"1GiB": "60GB/s"}}})
