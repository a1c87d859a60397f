"""The torchrun export: files, the launch script's rendezvous and node ranks, refusals."""

import json
import subprocess

import pytest

from autoplan.errors import ExportError
from autoplan.plugins import EXPORTERS, render_all
from tests.plugins.plans import changed, load_plan

HOSTS = [{"name": f"node{i:02d}", "ip": f"10.1.0.{10 + i}"} for i in range(4)]


def _multi_node():
    base = load_plan("llama8b_3d_vpp_sp")
    cluster = {**base.cluster, "nodes": 4, "hosts": HOSTS}
    plan = base.plan
    assert plan.world_size % cluster["gpus_per_node"] == 0
    return changed(base, cluster=cluster)


def test_registered():
    assert "torchrun" in EXPORTERS


def test_files_and_plan_round_trip():
    result = _multi_node()
    files = render_all(result, "torchrun")
    assert set(files) == {"train.py", "plan.json", "torchrun_args.txt", "launch_torchrun.sh"}
    assert json.loads(files["plan.json"]) == result.plan.model_dump(mode="json")
    compile(files["train.py"], "train.py", "exec")


def test_rendezvous_on_first_host_and_node_ranks_in_host_order():
    result = _multi_node()
    script = render_all(result, "torchrun")["launch_torchrun.sh"]
    nodes = result.plan.world_size // result.cluster["gpus_per_node"]
    assert f"NNODES={nodes}" in script
    assert f"NPROC_PER_NODE={result.cluster['gpus_per_node']}" in script
    assert 'MASTER_ADDR="${MASTER_ADDR:-10.1.0.10}"' in script
    for rank, host in enumerate(HOSTS[:nodes]):
        assert f"{host['name']}|{host['ip']}) NODE_RANK={rank} ;;" in script
    assert 'exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE"' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_node_rank_is_chosen_by_hostname(tmp_path):
    """Run the script's rendezvous part on a fake node02: NODE_RANK 2, first host's address."""
    script = render_all(_multi_node(), "torchrun")["launch_torchrun.sh"]
    head = script.split("ARGS=()")[0].replace('"$(hostname -s)"', "node02")
    head = head.replace(': "${MODEL_PY:?', ': "${MODEL_PY-x}" #')
    out = subprocess.run(["bash", "-c", head + 'echo "$NODE_RANK $MASTER_ADDR"'],
                         text=True, capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["2", "10.1.0.10"]


def test_refuses_context_parallelism():
    base = load_plan("llama8b_3d_vpp_sp")
    plan = base.plan
    with pytest.raises(ExportError, match="context parallelism"):
        render_all(changed(base, plan={"cp": 2, "dp": plan.dp // 2,
                                       "global_batch_size": plan.global_batch_size // 2}),
                   "torchrun")
