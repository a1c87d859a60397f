"""The topology graph, `autoplan topo`, and the slowdown a slow fabric causes to a pinned plan."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
from typer.testing import CliRunner

import autoplan
from autoplan.api import load_cluster
from autoplan.cli import app
from autoplan.cluster.topology import build_topology, group_links
from autoplan.costmodels.comm import communication_share, network_bound, network_note

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fat_tree(nodes: int, ratio: str = "2:1", kind: str = "fat-tree") -> dict:
    return {"preset": "dgx-a100", "nodes": nodes,
            "fabric": {"kind": kind, "oversubscription": ratio, "nodes_per_leaf": 4}}


def test_graph_has_gpus_switches_nics_leaves_and_thinner_spine_uplinks():
    graph = build_topology(load_cluster(_fat_tree(8)).cluster)
    kinds = [d["kind"] for _, d in graph.nodes(data=True)]
    assert (kinds.count("gpu"), kinds.count("nvswitch"), kinds.count("nic")) == (64, 8, 64)
    assert (kinds.count("leaf"), kinds.count("spine"), kinds.count("cpu")) == (2, 8, 8)
    assert graph.edges["gpu:3:5", "switch:3"]["bandwidth"] == 300e9
    assert graph.edges["nic:5:0", "leaf:1"]["bandwidth"] == 25e9
    # Each leaf: 4 nodes x 8 NICs x 25 GB/s down, half of it up over 8 spines.
    assert sum(graph.edges["leaf:0", f"spine:{k}"]["bandwidth"] for k in range(8)) == 400e9
    assert nx.is_connected(graph)


def test_rail_optimized_leaves_are_per_rail():
    graph = build_topology(load_cluster(_fat_tree(8, kind="rail-optimized")).cluster)
    assert graph.has_edge("nic:6:3", "leaf:3:1") and not graph.has_edge("nic:6:3", "leaf:0:1")


def test_a_cluster_without_fabric_has_one_switch_and_no_oversubscription():
    cluster = load_cluster(ROOT / "examples/clusters/dgx-a100-x16.yaml").cluster
    links = group_links(cluster, 16, 8)
    assert links.num_leaves == 1 and links.uplink_slowdown == 1.0
    assert build_topology(cluster).has_edge("nic:15:7", "fabric")


def test_topo_prints_a_summary_and_draws_small_and_summarised_pngs(tmp_path):
    runner = CliRunner()
    for name, label in (("dgx-h100-x4", "all 32 GPUs"), ("dgx-a100-x280", "all 2240 GPUs")):
        png = tmp_path / f"{name}.png"
        result = runner.invoke(app, ["topo", str(ROOT / f"examples/clusters/{name}.yaml"), "--png", str(png)])
        assert result.exit_code == 0, result.output
        assert label in result.output and "busbw" in result.output
        assert png.read_bytes()[:8] == PNG_MAGIC


def _four_nodes(bandwidth: str) -> dict:
    return {"name": f"4x8 A100, {bandwidth}", "gpu": "a100-sxm4-80gb", "nodes": 4, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "ethernet", "nics_per_node": 1, "bandwidth": bandwidth}}


def test_the_same_plan_on_a_64gbps_fabric_is_network_bound_and_800gbps_fixes_it():
    # DESIGN.md lore: a multi-node run slower than expected on a 64 Gb/s fabric; 800 Gb/s fixed it.
    # LLaMA-2 7B, TP=8 in each node, DP=4 across nodes with ZeRO-1: the DP gradient
    # reduce-scatter and weight all-gather (2 x 13.5 GB of bf16 per step over a NIC shared by 8
    # GPUs) cross the network.
    model = autoplan.load_model(ROOT / "examples/models/llama2_7b.py")
    pins = {"tp": 8, "dp": 4, "zero": 1}
    slow, fast = (autoplan.estimate(model, _four_nodes(bw), pins, seq_len=2048, global_batch=64).estimate
                  for bw in ("64Gbps", "800Gbps"))
    assert slow.step_time_s / fast.step_time_s > 2.5
    assert slow.time_breakdown_s["compute"] == pytest.approx(fast.time_breakdown_s["compute"])
    assert network_bound(slow) and not network_bound(fast)
    assert communication_share(slow) > 0.5 > communication_share(fast)
    assert "network-bound" in network_note(slow) and network_note(fast) is None
