"""The torchrun export: files, the launch script's rendezvous and node ranks, refusals."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan import api
from autoplan.errors import ExportError
from autoplan.plugins import EXPORTERS, render_all
from tests.plugins.plans import changed, load_plan
from tests.verify.cases import SEQ_LEN, model_path, stages

ROOT = Path(__file__).resolve().parents[2]

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


def test_node_ranks_follow_host_order_not_names(tmp_path):
    """Hosts listed out of name order: node ranks and the rendezvous address still follow the
    list (the order placement fills nodes in), not the names."""
    hosts = [{"name": name, "ip": f"10.2.0.{i + 1}"}
             for i, name in enumerate(["gpu-d", "gpu-b", "gpu-c", "gpu-a"])]
    base = _multi_node()
    script = render_all(changed(base, cluster={**base.cluster, "hosts": hosts}),
                        "torchrun")["launch_torchrun.sh"]
    head = script.split("ARGS=()")[0].replace(': "${MODEL_PY:?', ': "${MODEL_PY-x}" #')
    for rank, host in enumerate(hosts):
        run = head.replace('"$(hostname -s)"', host["name"])
        out = subprocess.run(["bash", "-c", run + 'echo "$NODE_RANK $MASTER_ADDR"'], text=True,
                             capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"})
        assert out.stdout.split() == [str(rank), "10.2.0.1"]


@pytest.mark.slow
def test_exported_script_trains_with_torchrun(tmp_path):
    """The export is a real launcher: launch_torchrun.sh starts train.py with torchrun on this
    node (gloo on CPU), two pipeline ranks train tiny_gpt and the last prints its losses."""
    graph = api.load_model(model_path("tiny_gpt")).trace(SEQ_LEN, "fp32")
    plan = dict(tp=1, pp=2, dp=1, cp=1, zero_stage=0, vpp=1, sequence_parallel=False,
                recompute="none", micro_batch_size=1, global_batch_size=2, num_microbatches=2,
                world_size=2, stages=stages(2, 6))
    result = changed(
        load_plan("llama8b_3d_vpp_sp"), plan=plan,
        cluster={"name": "cpu", "gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 2,
                 "intra_node": {"link": "nvswitch"}},
        model={"name": "tiny_gpt", "num_params": graph.num_params, "seq_len": SEQ_LEN,
               "layer_kinds": [layer.kind.value for layer in graph.layers]},
        training={"seq_len": SEQ_LEN, "global_batch": 2, "precision": "bf16",
                  "runtime": "megatron"})
    for name, text in render_all(result, "torchrun").items():
        (tmp_path / name).write_text(text)
    shim = tmp_path / "bin" / "torchrun"  # the torchrun of this interpreter
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin", "MODEL_PY": str(model_path("tiny_gpt")),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MASTER_PORT": str(_free_port())}
    out = subprocess.run(["bash", str(tmp_path / "launch_torchrun.sh"), "--steps", "2"],
                         text=True, capture_output=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in losses] == ["0", "1"], out.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
