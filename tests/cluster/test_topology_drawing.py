"""`topo --png`: vertices labelled as a reader names them, bandwidths written on the edges, a
legend of vertex and link kinds; checked on the drawing data, not on pixels."""

from __future__ import annotations

from pathlib import Path

from autoplan.api import load_cluster
from autoplan.cluster.render import topology_drawing

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "examples/clusters"


def _drawing(source):
    return topology_drawing(load_cluster(source).cluster)


def _legend_texts(drawing) -> list[str]:
    return [text for _, _, text in drawing.legend]


def test_one_node_names_every_gpu_and_its_switch_with_the_nvlink_bandwidth():
    drawing = _drawing(CLUSTERS / "dgx-a100-x1.yaml")
    labels = drawing.vertex_labels
    assert sorted(labels.values()) == sorted([f"GPU {g}" for g in range(8)] + ["node 0\nNVSwitch"])
    # dgx-a100-x1.yaml: intra_node 300GB/s per GPU, one edge per GPU to the NVSwitch.
    assert sorted(drawing.edge_labels.values()) == ["300 GB/s"] * 8
    assert "intra-node (nvlink3): 300 GB/s" in _legend_texts(drawing)
    assert {"GPU", "NVSwitch of a node"} <= set(_legend_texts(drawing))
    assert "1 node, 8 GPUs" in drawing.title


def test_a_summarised_cluster_labels_its_blocks_and_their_added_up_links():
    drawing = _drawing(CLUSTERS / "dgx-a100-x128.yaml")
    labels = drawing.vertex_labels
    # 128 nodes on one switch, cut into 16 blocks of 8 nodes (64 GPUs each).
    assert labels["fabric"] == "network\nswitch"
    assert sorted(v for k, v in labels.items() if k != "fabric") == sorted(
        f"nodes {8 * b}-{8 * b + 7}\n64 GPUs" for b in range(16))
    # A block's edge adds up 8 nodes x 8 NICs x 200 Gb/s (25 GB/s) = 1,600 GB/s.
    assert set(drawing.edge_labels.values()) == {"1,600 GB/s"}
    assert "network (infiniband-hdr): 1,600 GB/s" in _legend_texts(drawing)
    # The blocks sit below the switch, not beside it.
    assert all(drawing.positions[k][1] < drawing.positions["fabric"][1] for k in labels if k != "fabric")
    assert "8 x infiniband-hdr NIC 25 GB/s" in drawing.title


def test_a_fat_tree_names_leaves_and_spines_and_writes_the_thinner_uplinks():
    spec = {"gpu": "a100-sxm4-80gb", "nodes": 8, "gpus_per_node": 4,
            "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 2, "bandwidth": "200Gbps"},
            "fabric": {"kind": "fat-tree", "oversubscription": "2:1", "nodes_per_leaf": 4}}
    drawing = _drawing(spec)
    labels = set(drawing.vertex_labels.values())
    assert {"leaf 0", "leaf 1", "spine 0", "spine 1", "NIC 0:0", "GPU 7:3", "node 7\nNVSwitch"} <= labels
    # A leaf's downlinks: 4 nodes x 2 NICs x 25 GB/s = 200 GB/s; 2:1 over 2 spines = 50 GB/s each.
    assert "leaf to spine (uplink): 50 GB/s" in _legend_texts(drawing)
    assert {"300 GB/s", "25 GB/s", "50 GB/s"} <= set(drawing.edge_labels.values())
    assert {"leaf switch", "spine switch", "NIC"} <= set(_legend_texts(drawing))


def test_a_slow_ethernet_link_is_written_to_three_digits():
    drawing = _drawing(CLUSTERS / "pcie-x2-10gbe.yaml")
    # 10 Gb/s = 1.25 GB/s, not "1 GB/s".
    assert "network (ethernet-10g): 1.25 GB/s" in _legend_texts(drawing)
    assert "1.25 GB/s" in drawing.edge_labels.values()
