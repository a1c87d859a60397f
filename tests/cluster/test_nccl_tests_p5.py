"""Collectives across p5 nodes (8 H100, 32x 100 Gb/s EFA) against nccl-tests measured there
(tests/data/nccl_tests/README.md says where the table comes from).

At 32 MiB a whole-node ring's time is mostly latency once it spans a few nodes: the
all-gather takes 0.24 ms on 2 nodes and 2.7 ms on 32 (256 ranks), where the bytes alone would
take ~0.1 ms. That growth with the ranks and the network steps is what NCCL's tuning model
(costmodels/nccl_tuning.py, with the 75 us aws-ofi-nccl reports per network step) has to
carry; these are the sizes of TP activations and of gradient buckets."""

import csv
from pathlib import Path

import pytest

from autoplan.api import load_cluster
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm

TABLE = Path(__file__).resolve().parents[1] / "data" / "nccl_tests" / "p5_efa.csv"
COLLECTIVES = {"all_gather": comm.all_gather_time, "all_reduce": comm.all_reduce_time}


def _rows(size_bytes: int) -> list[dict]:
    with TABLE.open() as f:
        return [r for r in csv.DictReader(f) if int(r["size_bytes"]) == size_bytes]


def _p5(nodes: int):
    return load_cluster({"name": f"p5-x{nodes}", "preset": "dgx-h100", "nodes": nodes,
                         "inter_node": {"link": "efa", "nics_per_node": 32,
                                        "bandwidth": "100Gbps"}}).cluster


def _measured_s(row: dict) -> float:
    """nccl-tests' algbw is size / time (GB/s of 1e9 bytes)."""
    return int(row["size_bytes"]) / (float(row["algbw_GBps"]) * 1e9)


def _predicted_s(row: dict) -> float:
    nodes, gpus = int(row["nodes"]), int(row["gpus"])
    links = group_links(_p5(nodes), gpus, 1)
    return COLLECTIVES[row["collective"]](int(row["size_bytes"]), links)


@pytest.mark.parametrize("row", _rows(32 * 2**20),
                         ids=lambda r: f"{r['collective']}-{r['nodes']}nodes")
def test_32_mib_collectives_follow_nccl_tests_from_2_to_32_nodes(row):
    assert _predicted_s(row) == pytest.approx(_measured_s(row), rel=0.25)


@pytest.mark.parametrize("collective", sorted(COLLECTIVES))
def test_latency_grows_with_the_ranks_as_measured(collective):
    # measured: all-gather 0.389 -> 2.699 ms (6.9x), all-reduce 0.682 -> 1.008 ms (1.5x, a
    # tree's log2 latency) from 4 to 32 nodes at 32 MiB. From 4 nodes on, tuning.cc prices
    # ring and tree with the network's bandwidth (bwInter) alike, so the ratio is the latency's
    # growth; on 2 nodes the tree takes its intra-node bandwidth instead (next test).
    rows = {int(r["nodes"]): r for r in _rows(32 * 2**20) if r["collective"] == collective}
    measured = _measured_s(rows[32]) / _measured_s(rows[4])
    predicted = _predicted_s(rows[32]) / _predicted_s(rows[4])
    assert predicted == pytest.approx(measured, rel=0.25)


def test_two_node_all_reduce_runs_at_the_trees_intra_node_bandwidth():
    # nccl-tests on 2 p5 nodes, 512 MiB-8 GiB: busbw 396-478 GB/s, above the 328 GB/s the
    # all-gather (a ring through the NICs) reaches at 2 GiB. tuning.cc prices a 2-node tree by
    # its intra-node bandwidth (bwIntra, up to 2x the network's): each byte crosses the network
    # once each way, a ring's nearly twice. Priced as a ring these rows were 1.43-1.51x slow.
    rows = [r for r in _large_rows(nodes=2) if r["collective"] == "all_reduce"]
    assert len(rows) == 5
    for row in rows:
        assert _predicted_s(row) / _measured_s(row) == pytest.approx(1.0, abs=0.2)


def _large_rows(nodes: int | None = None) -> list[dict]:
    """Rows from 512 MiB on 4 or more nodes (or on ``nodes``)."""
    with TABLE.open() as f:
        return [r for r in csv.DictReader(f) if int(r["size_bytes"]) >= 512 * 2**20
                and (int(r["nodes"]) >= 4 if nodes is None else int(r["nodes"]) == nodes)]


@pytest.mark.parametrize("nodes", [4, 8, 16, 32])
def test_bandwidth_bound_collectives_follow_nccl_tests_at_every_node_count(nodes):
    # From 512 MiB the bytes set the time: all_gather_perf to 2 GiB and all_reduce_perf to
    # 8 GiB, 7 to 8 sizes per node count. With the second-generation EFA's loss per doubling of
    # the nodes (catalog efa-v2, 0.965) every one is predicted within 0.75-1.5x (the flat 0.70
    # from 8 nodes on of 2019 p3dn figures put them up to 1.76x slow). What is left, 1.1-1.4x
    # slow on all-reduce, is not the loss with nodes (2 nodes: 1.08-1.17x since the 2-node
    # tree takes its intra-node bandwidth, 1.3-1.5x before).
    rows = [r for r in _large_rows() if int(r["nodes"]) == nodes]
    assert len(rows) >= 7
    for row in rows:
        ratio = _predicted_s(row) / _measured_s(row)
        assert 0.75 <= ratio <= 1.5, (row["collective"], row["size_bytes"], ratio)
