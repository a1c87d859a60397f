"""cluster.yaml: presets, groups, fabric, host keys, and bad files through the CLI (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.api import load_cluster
from autoplan.cli import app
from autoplan.cluster import require_homogeneous
from autoplan.errors import ClusterSpecError, ConstraintError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"
GOOD = ("gpu: a100-sxm4-80gb\nnodes: 2\ngpus_per_node: 8\n"
        "intra_node: {link: nvswitch, bandwidth: 300GB/s}\n"
        "inter_node: {link: infiniband, nics_per_node: 8, bandwidth: 200Gbps}\n")


CLUSTER_FILES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.stem.startswith("nccl-profile"))


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.stem)
def test_every_example_cluster_loads(path):
    cluster = load_cluster(path).cluster
    assert cluster.num_gpus >= 1


def test_a_preset_fills_the_node_and_stated_keys_win():
    cluster = load_cluster({"preset": "dgx-h100", "nodes": 4,
                            "inter_node": {"interface": "ib0"}, "cpu_memory": "1TB"}).cluster
    assert (cluster.gpu.name, cluster.gpus_per_node, cluster.num_gpus) == ("h100-sxm5-80gb", 8, 32)
    assert cluster.intra.bandwidth_Bps == 450e9
    assert (cluster.nics_per_node, cluster.inter.bandwidth_Bps) == (8, 50e9)  # kept from preset
    assert cluster.interface == "ib0"
    assert cluster.cpu_memory_bytes == 1e12 and cluster.host_bandwidth_Bps == 64e9


def test_heterogeneous_groups_parse_and_one_kind_commands_refuse_them():
    loaded = load_cluster({
        "name": "lab", "fabric": {"kind": "rail-optimized", "oversubscription": "2:1", "nodes_per_leaf": 4},
        "groups": [
            {"name": "a100", "preset": "dgx-a100", "nodes": 8},
            {"name": "v100", "preset": "dgx-1-v100", "nodes": 4,
             "hosts": [{"name": f"v{i}", "ip": f"10.0.1.{i}"} for i in range(4)]},
        ]})
    cluster = loaded.cluster
    assert [(g.name, g.num_nodes, g.gpu.name) for g in cluster.groups] == [
        ("a100", 8, "a100-sxm4-80gb"), ("v100", 4, "v100-sxm2-32gb")]
    assert (cluster.num_nodes, cluster.num_gpus, len(cluster.hosts)) == (12, 96, 4)
    assert cluster.fabric.oversubscription == 2.0
    assert not cluster.is_homogeneous
    with pytest.raises(ConstraintError, match="sweep assumes one kind of node"):
        require_homogeneous(cluster, "sweep")
    # The dumped spec (what a plan JSON keeps) loads back to the same cluster.
    assert load_cluster(loaded.spec).cluster == cluster


def test_identical_groups_are_homogeneous():
    cluster = load_cluster({"groups": [{"name": "a", "preset": "dgx-a100", "nodes": 2},
                                       {"name": "b", "preset": "dgx-a100", "nodes": 2}]}).cluster
    require_homogeneous(cluster)
    assert cluster.num_gpus == 32


@pytest.mark.parametrize("fabric, message", [
    ({"oversubscription": "2:1"}, "nodes_per_leaf"),
    ({"oversubscription": "1:2", "nodes_per_leaf": 4}, "1:1"),
    ({"oversubscription": "fast", "nodes_per_leaf": 4}, '"2:1"'),
    ({"kind": "torus"}, "fabric.kind"),
])
def test_bad_fabrics_say_what_to_write(fabric, message):
    with pytest.raises(ClusterSpecError, match=message):
        load_cluster({"preset": "dgx-a100", "nodes": 8, "fabric": fabric})


def _topo(tmp_path, text: str):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return CliRunner().invoke(app, ["topo", str(path)])


@pytest.mark.parametrize("text, says", [
    (GOOD.replace("200Gbps", "200"), ["inter_node.bandwidth", "no unit", "300GB/s"]),
    (GOOD.replace("bandwidth: 300GB/s", "bandwith: 300GB/s"), ["intra_node.bandwith", "did you mean 'bandwidth'"]),
    (GOOD.replace("a100-sxm4-80gb", "a100"), ["unknown GPU 'a100'", "a100-sxm4-80gb"]),
    (GOOD.replace("nodes: 2", "nodes: -2"), ["nodes", "greater than or equal to 1", "-2"]),
    (GOOD.replace("gpus_per_node: 8", "gpus_per_node: 0"), ["gpus_per_node", "0"]),
    (GOOD + "hosts:\n  - {name: a, ip: 10.0.0.1}\n", ["hosts lists 1 hosts but nodes is 2", "one host per node"]),
    (GOOD + "hosts:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.256}\n", ["hosts.1.ip", "10.0.0.1"]),
    ("", ["expected a mapping", "gpu, nodes"]),
    ("- gpu: a100-sxm4-80gb\n- nodes: 2\n", ["expected a mapping", "list"]),
    ("gpu: [unclosed\n", ["not valid YAML"]),
    ("nodes: 2\n", ["gpu: missing", "preset: dgx-a100"]),
    (GOOD + "cpu_memory: 2048\n", ["cpu_memory", "no unit", "80GiB"]),
    ("preset: dgx-a1000\nnodes: 1\n", ["unknown preset", "dgx-a100"]),
    (GOOD + "nccl_profile: missing.yaml\n", ["nccl_profile", "no such file"]),
    (GOOD + "nccl_profile: {intra_node: {1MiB: 60}}\n", ["nccl_profile.intra_node", "no unit"]),
    ("groups:\n  - {name: a, preset: dgx-a100, nodes: 2}\nnodes: 2\n", ["with groups", "nodes"]),
])
def test_bad_cluster_files_exit_2_with_what_to_fix(tmp_path, text, says):
    result = _topo(tmp_path, text)
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    for fragment in says:
        assert fragment in message


def test_missing_file_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["topo", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "no such file" in result.output


ONE_GPU = "gpu: a100-sxm4-80gb\nnodes: 1\ngpus_per_node: 1\n"


def test_a_one_gpu_cluster_needs_no_intra_node_link(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text(ONE_GPU)
    assert load_cluster(path).cluster.num_gpus == 1
    tiny = str(EXAMPLES.parent / "models" / "tiny_gpt.py")
    for command in (["topo", str(path)],
                    ["solve", tiny, str(path), "--seq-len", "64", "--global-batch", "4"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, result.output


def test_two_gpus_in_a_node_still_need_their_link():
    with pytest.raises(ClusterSpecError, match="intra_node: missing"):
        load_cluster({"gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 2})
