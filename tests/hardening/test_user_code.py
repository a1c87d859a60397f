"""model.py is user code: it runs in a guarded child with a time limit and a memory cap, and
never writes to our stdout."""

import json

import pytest
from typer.testing import CliRunner

import autoplan
from autoplan.cli import app
from autoplan.errors import ModelFileError

DGX1 = "examples/clusters/dgx-a100-x1.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def write(tmp_path, body: str):
    path = tmp_path / "model.py"
    path.write_text("import torch\nfrom torch import nn\n" + body)
    return path


def test_a_model_that_loops_forever_is_stopped(tmp_path):
    path = write(tmp_path, "def build_model():\n    while True:\n        pass\n")
    model = autoplan.load_model(path, trace_time_limit_s=2)
    with pytest.raises(ModelFileError, match="did not finish within 2 s"):
        model.trace(64)


def test_a_model_that_allocates_terabytes_is_stopped(tmp_path):
    path = write(tmp_path, "def build_model():\n"
                           "    x = torch.ones(2**40, device='cpu')\n"
                           "    return nn.Linear(4, 4)\n")
    with pytest.raises(ModelFileError):
        autoplan.load_model(path).trace(64)


def test_a_model_that_prints_keeps_json_clean(tmp_path):
    path = write(tmp_path, "print('hello from import')\n"
                           "from autoplan.zoo import GPT, GPTConfig\n"
                           "def build_model():\n"
                           "    print('hello from build_model')\n"
                           "    return GPT(GPTConfig(num_layers=2, hidden_size=64, num_heads=4,"
                           " vocab_size=256, max_seq_len=64))\n")
    result = CliRunner().invoke(app, ["solve", str(path), DGX1, "--seq-len", "64",
                                      "--global-batch", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["world_size"] >= 1


def test_import_errors_name_the_file_and_exit_2(tmp_path):
    path = write(tmp_path, "raise RuntimeError('no GPU here')\n")
    result = CliRunner().invoke(app, ["solve", str(path), DGX1, "--seq-len", "64",
                                      "--global-batch", "8"])
    assert result.exit_code == 2
    assert "no GPU here" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("where", ["import", "build_model"])
def test_sys_exit_in_model_py_is_one_paragraph_not_a_traceback(tmp_path, where):
    body = ("import sys\nsys.exit(3)\ndef build_model():\n    return nn.Linear(4, 4)\n"
            if where == "import" else
            "import sys\ndef build_model():\n    sys.exit('done')\n")
    result = CliRunner().invoke(app, ["solve", str(write(tmp_path, body)), DGX1, "--seq-len",
                                      "64", "--global-batch", "8"])
    assert result.exit_code == 2, result.output
    assert "sys.exit(" in result.stderr and "must not exit" in result.stderr
    assert "Traceback" not in result.output


def test_a_segfault_in_model_py_is_reported_as_a_crash_not_as_memory(tmp_path):
    path = write(tmp_path, "import ctypes\ndef build_model():\n"
                           "    ctypes.string_at(0)\n    return nn.Linear(4, 4)\n")
    with pytest.raises(ModelFileError, match="SIGSEGV") as error:
        autoplan.load_model(path).trace(64)
    assert "memory" not in str(error.value)


LOOPING = "def build_model():\n    while True:\n        pass\n"


@pytest.mark.parametrize("command", [
    ["solve", "{model}", DGX1, "--seq-len", "64", "--global-batch", "8"],
    ["estimate", "{model}", DGX1, "--seq-len", "64", "--global-batch", "8"],
    ["trace", "{model}", "--seq-len", "64"],
    ["infer", "{model}", DGX1, "--context-len", "64"],
])
def test_trace_timeout_flag_stops_a_looping_model_and_says_how_to_raise_it(tmp_path, command):
    path = write(tmp_path, LOOPING)
    args = [a.format(model=path) for a in command] + ["--trace-timeout", "1.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "did not finish within 1.5 s" in result.stderr
    assert "--trace-timeout SECONDS" in result.stderr and "Traceback" not in result.output


def test_trace_timeout_options_key_stops_a_looping_model(tmp_path):
    options = tmp_path / "options.yaml"
    options.write_text("trace_timeout: 1.5\n")
    result = CliRunner().invoke(app, ["solve", str(write(tmp_path, LOOPING)), DGX1, "--seq-len",
                                      "64", "--global-batch", "8", "--options", str(options)])
    assert result.exit_code == 2, result.output
    assert "did not finish within 1.5 s" in result.stderr and "trace_timeout" in result.stderr
