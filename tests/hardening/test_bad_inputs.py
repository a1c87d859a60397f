"""The catalogue of bad inputs: every mistake a user can make, run through the CLI.

For each case: the exact exit code (2 bad input, 3 infeasible, 4 time limit with no plan), no
traceback, and a message that points at the culprit: it names the file, field or flag and shows
the bad value. This is the one place a reviewer looks to see how autoplan answers bad input;
some cases repeat narrower tests elsewhere (tests/cluster/test_spec.py,
tests/graph/test_trace_errors.py).

A case is ``(argv builder, exit code, fragments)``: the builder gets a ``Files`` helper and
returns the command line; ``{tmp}`` in a fragment stands for the case's temporary folder.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.search import table

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "models" / "tiny_gpt.py")
DGX1 = str(ROOT / "examples" / "clusters" / "dgx-a100-x1.yaml")
MIXED = str(ROOT / "examples" / "clusters" / "lab-a100-v100-mixed.yaml")
GPT3 = str(ROOT / "examples" / "models" / "gpt3_175b.py")
DGX128 = str(ROOT / "examples" / "clusters" / "dgx-a100-x128.yaml")
TRAIN = ["--seq-len", "64", "--global-batch", "8"]
GOOD = ("gpu: a100-sxm4-80gb\nnodes: 2\ngpus_per_node: 8\n"
        "intra_node: {link: nvswitch, bandwidth: 300GB/s}\n"
        "inter_node: {link: infiniband, nics_per_node: 8, bandwidth: 200Gbps}\n")
MODEL_HEADER = "import torch\nfrom torch import nn\n"


class Files:
    """Writes a case's input files into its temporary folder."""

    def __init__(self, folder: Path, plan_json: str) -> None:
        self.folder, self.plan_json = folder, plan_json

    def write(self, name: str, text: str) -> str:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)

    def cluster(self, text: str) -> list[str]:
        """``solve`` of the tiny model on this cluster.yaml."""
        return ["solve", TINY, self.write("cluster.yaml", text), *TRAIN]

    def model(self, body: str) -> list[str]:
        """``solve`` of this model.py on one DGX A100."""
        return ["solve", self.write("model.py", MODEL_HEADER + body), DGX1, *TRAIN]

    def plan(self) -> str:
        """A real plan JSON (tiny model, one DGX A100)."""
        return self.write("plan.json", self.plan_json)


def solve(*extra: str):
    return lambda f: ["solve", TINY, DGX1, *TRAIN, *extra]


CASES = {
    # cluster.yaml
    "yaml_malformed": (lambda f: f.cluster("gpu: [unclosed\n"), 2,
                       ["{tmp}/cluster.yaml", "not valid YAML"]),
    "yaml_empty": (lambda f: f.cluster(""), 2,
                   ["{tmp}/cluster.yaml", "expected a mapping", "got NoneType"]),
    "yaml_not_mapping": (lambda f: f.cluster("- gpu: a100-sxm4-80gb\n- nodes: 2\n"), 2,
                         ["{tmp}/cluster.yaml", "expected a mapping", "got list"]),
    "yaml_missing_file": (lambda f: ["solve", TINY, str(f.folder / "nope.yaml"), *TRAIN], 2,
                          ["{tmp}/nope.yaml", "no such file"]),
    "yaml_missing_unit": (lambda f: f.cluster(GOOD.replace("200Gbps", "200")), 2,
                          ["inter_node.bandwidth", "no unit", "got 200"]),
    "yaml_wrong_unit": (lambda f: f.cluster(GOOD.replace("300GB/s", "300GiB")), 2,
                        ["intra_node.bandwidth", "GiB", "300GiB"]),
    "yaml_key_typo": (lambda f: f.cluster(GOOD.replace("bandwidth: 300GB/s", "bandwith: 300GB/s")), 2,
                      ["intra_node.bandwith", "unknown key", "did you mean 'bandwidth'"]),
    "yaml_top_level_typo": (lambda f: f.cluster(GOOD.replace("gpus_per_node", "gpu_per_node")), 2,
                            ["gpu_per_node", "did you mean 'gpus_per_node'"]),
    "yaml_unknown_gpu": (lambda f: f.cluster(GOOD.replace("a100-sxm4-80gb", "a100")), 2,
                         ["unknown GPU 'a100'", "a100-sxm4-80gb"]),
    "yaml_negative_nodes": (lambda f: f.cluster(GOOD.replace("nodes: 2", "nodes: -2")), 2,
                            ["nodes", "greater than or equal to 1", "got -2"]),
    "yaml_zero_gpus_per_node": (lambda f: f.cluster(GOOD.replace("gpus_per_node: 8", "gpus_per_node: 0")), 2,
                                ["gpus_per_node", "got 0"]),
    "yaml_hosts_vs_nodes": (lambda f: f.cluster(GOOD + "hosts:\n  - {name: a, ip: 10.0.0.1}\n"), 2,
                            ["hosts lists 1 hosts but nodes is 2", "one host per node"]),
    "yaml_bad_ip": (lambda f: f.cluster(GOOD + "hosts:\n  - {name: a, ip: 10.0.0.1}\n"
                                        "  - {name: b, ip: 10.0.0.256}\n"), 2,
                    ["hosts.1.ip", "'10.0.0.256' is not an IP address"]),
    "yaml_no_inter_node": (lambda f: f.cluster(GOOD.split("inter_node")[0]), 2,
                           ["nodes is 2 but inter_node is missing"]),
    "cluster_heterogeneous_infer": (lambda f: ["infer", TINY, MIXED, "--context-len", "64"], 2,
                                    ["mixes kinds of node", "a100", "v100",
                                     "inference placement assumes one kind of node"]),
    # model.py
    "model_missing_file": (lambda f: ["solve", str(f.folder / "nope.py"), DGX1, *TRAIN], 2,
                           ["{tmp}/nope.py", "no such file"]),
    "model_no_build_model": (lambda f: f.model("x = 1\n"), 2,
                             ["{tmp}/model.py", "defines no build_model()"]),
    "model_syntax_error": (lambda f: f.model("def build_model(:\n"), 2,
                           ["{tmp}/model.py", "syntax error at line 3"]),
    "model_raises_on_import": (lambda f: f.model("raise RuntimeError('no GPU here')\n"), 2,
                               ["model.py", "no GPU here"]),
    "model_build_raises": (lambda f: f.model("def build_model():\n    raise RuntimeError('boom')\n"), 2,
                           ["build_model() raised RuntimeError: boom"]),
    "model_returns_non_module": (lambda f: f.model("def build_model():\n    return 3\n"), 2,
                                 ["build_model() returned int, not a torch.nn.Module"]),
    # pins and batch
    "pins_exceed_world": (solve("--tp", "4", "--pp", "4"), 2,
                          ["pinned degrees multiply to 16 GPUs", "cluster has 8"]),
    "pins_dp_exceeds_world": (solve("--tp", "2", "--pp", "2", "--dp", "3"), 2,
                              ["multiply to 12 GPUs", "cluster has 8"]),
    "pin_tp_not_dividing_heads": (solve("--tp", "3"), 2, ["--tp 3", "attention heads"]),
    "batch_not_divisible_by_dp": (lambda f: ["solve", TINY, DGX1, "--seq-len", "64",
                                             "--global-batch", "7", "--dp", "2"], 2,
                                  ["--global-batch 7", "--dp 2"]),
    "batch_not_divisible_by_mbs": (solve("--mbs", "3"), 2, ["--global-batch 8", "--mbs 3"]),
    "batch_not_divisible_by_dp_mbs": (solve("--dp", "4", "--mbs", "4"), 2,
                                      ["--global-batch 8", "dp*mbs = 16"]),
    "estimate_pins_exceed_world": (lambda f: ["estimate", TINY, DGX1, *TRAIN, "--tp", "4", "--dp", "4"], 2,
                                   ["multiply to 16 GPUs", "cluster has 8"]),
    "missing_seq_len": (lambda f: ["solve", TINY, DGX1], 2, ["--seq-len", "--global-batch"]),
    "pin_negative": (solve("--tp", "-1"), 2, ["Invalid value for '--tp'", "greater than or equal to 1"]),
    "global_batch_zero": (lambda f: ["solve", TINY, DGX1, "--seq-len", "64", "--global-batch", "0"], 2,
                          ["Invalid value for '--global-batch'"]),
    "runtime_typo": (solve("--runtime", "megatorn"), 2, ["--runtime 'megatorn'", "megatron, deepspeed, fsdp"]),
    "precision_typo": (solve("--precision", "fp8x"), 2, ["--precision 'fp8x'", "bf16, fp16"]),
    # memory
    "nothing_fits_memory_cap": (solve("--mem-limit", "1GiB"), 3,
                                ["nothing fits in 0.9 GiB per GPU", "5% headroom", "GiB over"]),
    "mem_limit_without_unit": (solve("--mem-limit", "72"), 2, ["--mem-limit", "'72' has no unit", "80GiB"]),
    "mem_limit_wrong_unit": (solve("--mem-limit", "72Gbps"), 2, ["--mem-limit", "not a unit of memory"]),
    # time limit: bounding the shapes is slowed (see _slow_bounds) so 0.1 s pass before any plan
    "time_limit_no_plan": (lambda f: ["solve", GPT3, DGX128, "--seq-len", "2048", "--global-batch",
                                      "1536", "--time-limit", "0.1"], 4,
                           ["--time-limit 0.1s", "raise the limit"]),
    # plan JSON files
    "export_not_json": (lambda f: ["export", f.write("bad.json", "not json"), "--to", "megatron",
                                   "--out", str(f.folder / "out")], 2,
                        ["{tmp}/bad.json", "not a plan document", "Invalid JSON", "line 1"]),
    "export_wrong_json": (lambda f: ["export", f.write("bad.json", '{"plan": {"tp": 2}}'), "--to",
                                     "megatron", "--out", str(f.folder / "out")], 2,
                          ["{tmp}/bad.json", "not a plan document", "Field required"]),
    "export_json_list": (lambda f: ["export", f.write("bad.json", "[1, 2]"), "--to", "megatron",
                                    "--out", str(f.folder / "out")], 2,
                         ["{tmp}/bad.json", "not a plan document", "object"]),
    "export_plan_is_folder": (lambda f: ["export", str(f.folder), "--to", "megatron",
                                         "--out", str(f.folder / "out")], 2,
                              ["{tmp}", "is a folder"]),
    "export_missing_plan": (lambda f: ["export", str(f.folder / "nope.json"), "--to", "megatron",
                                       "--out", str(f.folder / "out")], 2,
                            ["{tmp}/nope.json", "no such file"]),
    "explain_not_json": (lambda f: ["explain", f.write("bad.json", "{"), "--model", TINY], 2,
                         ["{tmp}/bad.json", "not a plan document", "Invalid JSON"]),
    "verify_not_json": (lambda f: ["verify", TINY, f.write("bad.json", "not json")], 2,
                        ["{tmp}/bad.json", "not a plan document"]),
    # existing outputs without --force
    "export_existing_files": (lambda f: ["export", f.plan(), "--to", "megatron",
                                         "--out", str(Path(f.write("out/megatron_args.txt", "x")).parent)], 2,
                              ["{tmp}/out/megatron_args.txt", "already exist", "--force"]),
    "solve_export_existing_files": (lambda f: ["solve", TINY, DGX1, *TRAIN, "--export", "megatron", "--out",
                                               str(Path(f.write("out/launch_megatron.sh", "x")).parent)], 2,
                                    ["{tmp}/out/launch_megatron.sh", "already exist", "--force"]),
    "solve_export_without_out": (solve("--export", "megatron"), 2, ["--export needs --out"]),
    "topo_png_exists": (lambda f: ["topo", DGX1, "--png", f.write("topo.png", "x")], 2,
                        ["{tmp}/topo.png", "already exists", "--force"]),
    "explain_plots_exist": (lambda f: ["explain", f.plan(), "--model", TINY, "--plots",
                                       str(Path(f.write("plots/plan_on_cluster.png", "x")).parent)], 2,
                            ["{tmp}/plots/plan_on_cluster.png", "already exists", "--force"]),
    "sweep_out_exists": (lambda f: ["sweep", TINY, DGX1, "--over", "nodes=1", *TRAIN, "--workers", "1",
                                    "--out", str(Path(f.write("sweep/sweep.json", "x")).parent)], 2,
                         ["{tmp}/sweep/sweep.json", "already exist", "--force"]),
    # sweep grids
    "sweep_over_malformed": (lambda f: ["sweep", TINY, DGX1, "--over", "nodes", *TRAIN], 2,
                             ["--over 'nodes'", "NAME=V1,V2"]),
    "sweep_over_zero_nodes": (lambda f: ["sweep", TINY, DGX1, "--over", "nodes=0,1", *TRAIN], 2,
                              ["sweep point nodes=0", "nodes", "greater than or equal to 1", "got 0"]),
    "sweep_over_unknown_gpu": (lambda f: ["sweep", TINY, DGX1, "--over", "gpu=a100", *TRAIN], 2,
                               ["unknown GPU 'a100'", "a100-sxm4-80gb"]),
    "sweep_over_unknown": (lambda f: ["sweep", TINY, DGX1, "--over", "nodez=1,2", *TRAIN], 2,
                           ["nodez", "unknown key", "nodes"]),
}


@pytest.fixture(scope="module")
def _shared_traces():
    """One Model per example file for the whole module, so each is traced once (tracing runs in
    a child process and costs seconds); model.py files written by a case load as usual."""
    load, shared = api.load_model, {}

    def load_model(path_or_module, **kwargs):
        key = str(path_or_module)
        if key not in (TINY, GPT3):
            return load(path_or_module, **kwargs)
        return shared.setdefault(key, load(path_or_module, **kwargs))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "load_model", load_model)
        yield


@pytest.fixture(scope="module")
def plan_json(_shared_traces) -> str:
    result = CliRunner().invoke(app, ["solve", TINY, DGX1, *TRAIN, "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout


def _slow_bounds(case: str, monkeypatch) -> None:
    """The solver proves GPT-3 on 1024 GPUs optimal well within 0.1 s on a fast machine; for
    the time-limit case every shape bound takes 50 ms, so the limit passes before any plan."""
    if case != "time_limit_no_plan":
        return
    bound = table.shape_lower_bound_s

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return bound(*args, **kwargs)

    monkeypatch.setattr(table, "shape_lower_bound_s", slow)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_with_its_code_and_names_the_culprit(case, tmp_path, plan_json,
                                                             monkeypatch):
    build, code, fragments = CASES[case]
    _slow_bounds(case, monkeypatch)
    argv = build(Files(tmp_path, plan_json))
    result = CliRunner().invoke(app, argv)
    assert isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    message = " ".join(result.stderr.split())
    for fragment in fragments:
        assert fragment.replace("{tmp}", str(tmp_path)) in message, message


@pytest.mark.parametrize("case", ["yaml_missing_unit", "model_no_build_model",
                                  "nothing_fits_memory_cap", "time_limit_no_plan",
                                  "solve_export_existing_files"])
def test_errors_under_json_leave_stdout_empty(case, tmp_path, plan_json, monkeypatch):
    """--json promises one JSON document on stdout; an error prints none (stderr only)."""
    build, code, _ = CASES[case]
    _slow_bounds(case, monkeypatch)
    result = CliRunner().invoke(app, [*build(Files(tmp_path, plan_json)), "--json"])
    assert result.exit_code == code
    assert result.stdout == ""


def test_force_overwrites_what_was_refused(tmp_path, plan_json):
    files = Files(tmp_path, plan_json)
    png = files.write("topo.png", "x")
    result = CliRunner().invoke(app, ["topo", DGX1, "--png", png, "--force"])
    assert result.exit_code == 0, result.output
    assert Path(png).read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topo.png"]  # no temporary left over
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "plan_on_cluster.png").write_text("x")
    result = CliRunner().invoke(app, ["explain", files.plan(), "--model", TINY, "--plots",
                                      str(plots), "--force", "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert sorted(p.name for p in plots.iterdir()) == ["memory_per_stage.png", "plan_on_cluster.png"]
