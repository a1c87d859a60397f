"""Whole-process speed without timing anything: commands that do not trace never import
torch and commands that do not search never import OR-Tools, a repeat solve reads its trace from the cache instead of tracing, and --verbose says
what the search did on stderr while stdout keeps the same JSON."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.graph import model as model_module
from autoplan.graph import trace_cache

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DGX16 = str(EXAMPLES / "clusters" / "dgx-a100-x16.yaml")
TRAIN = ["--seq-len", "256", "--global-batch", "64"]

NO_TORCH = """
import sys
from typer.testing import CliRunner
from autoplan.cli import app
for args in {argv!r}:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
print(sorted(m for m in ("torch", "matplotlib", "ortools") if m in sys.modules))
"""


def test_help_export_and_topo_import_neither_torch_nor_ortools(tmp_path):
    """The commands that trace and search nothing run in a process that never imports torch,
    matplotlib or OR-Tools (CP-SAT: loaded by the commands that solve)."""
    plan = ROOT / "tests" / "plugins" / "data" / "gpt13b_ethernet_10g.json"
    argv = [["--help"], ["solve", "--help"], ["topo", DGX16],
            ["export", str(plan), "--to", "megatron", "--out", str(tmp_path / "out")],
            ["export", str(plan), "--to", "all", "--out", str(tmp_path / "all")]]
    done = subprocess.run([sys.executable, "-c", NO_TORCH.format(argv=argv)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert (tmp_path / "out").is_dir()


@pytest.fixture
def tiny(tmp_path) -> Path:
    """A copy of the tiny GPT example the tests may edit."""
    copy = tmp_path / "tiny_gpt.py"
    shutil.copy(EXAMPLES / "models" / "tiny_gpt.py", copy)
    return copy


@pytest.fixture
def traces(monkeypatch) -> list:
    """Counts the traces that really run (in the guarded child)."""
    calls, real = [], model_module.Guarded

    def counting(*args, **kwargs):
        calls.append(args[1:4])
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "Guarded", counting)
    return calls


def _solve_json(tiny: Path, *extra: str) -> tuple[str, str]:
    result = CliRunner().invoke(app, [*extra, "solve", str(tiny), DGX16, *TRAIN, "--json"])
    assert result.exit_code == 0, result.output
    return re.sub(r'"wall_time_s": [0-9.e+-]+', '"wall_time_s": 0', result.stdout), result.stderr


def test_a_repeat_solve_reads_the_trace_from_the_cache(tiny, traces):
    first, _ = _solve_json(tiny)
    assert len(traces) == 1
    second, _ = _solve_json(tiny)
    assert len(traces) == 1, "the second solve traced again"
    assert second == first
    assert json.loads(second)["plan"]


def test_a_changed_model_file_is_traced_again(tiny, traces):
    _solve_json(tiny)
    tiny.write_text(tiny.read_text() + "\n# an edit that changes nothing but the bytes\n")
    _solve_json(tiny)
    assert len(traces) == 2


def test_a_changed_imported_file_is_traced_again(tmp_path, traces):
    """model.py's own imports (a sibling module) are part of what the entry depends on."""
    (tmp_path / "sizes.py").write_text("HIDDEN = 64\n")
    source = (EXAMPLES / "models" / "tiny_gpt.py").read_text()
    model_file = tmp_path / "tiny_sized.py"
    model_file.write_text("import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\n"
                          "import sizes  # noqa: F401\n" + source)
    model_module.load_model(model_file).trace(256)
    model_module.load_model(model_file).trace(256)
    assert len(traces) == 1
    (tmp_path / "sizes.py").write_text("HIDDEN = 128\n")
    model_module.load_model(model_file).trace(256)
    assert len(traces) == 2


def test_a_corrupt_entry_is_ignored_and_rewritten(tiny, traces):
    graph = model_module.load_model(tiny).trace(256)
    entry = trace_cache.entry_path(tiny, 256, "bf16")
    entry.write_bytes(b"not a pickle")
    again = model_module.load_model(tiny).trace(256)
    assert len(traces) == 2 and again == graph
    assert trace_cache.load(tiny, 256, "bf16") == graph  # rewritten, readable again


def test_no_cache_neither_reads_nor_writes(tiny, traces, monkeypatch):
    monkeypatch.setenv(trace_cache.DISABLE_ENV, "")  # restored after the test: --no-cache sets it
    first, _ = _solve_json(tiny, "--no-cache")
    assert not trace_cache.cache_dir().exists()
    second, _ = _solve_json(tiny, "--no-cache")
    assert len(traces) == 2 and second == first


STARTED_AHEAD = """
import sys
from autoplan.graph.model import load_model
model = load_model({path!r}, cache=False)
model.start_trace(256)
assert "torch" not in sys.modules  # the child imports it
graph = model.trace(256)
assert "torch" not in sys.modules
print(len(graph.layers), sum(layer.num_params for layer in graph.layers))
"""


def test_a_trace_started_ahead_is_the_trace_and_leaves_torch_to_its_child(tiny, traces):
    """``start_trace`` (what the CLI does before importing the search) runs the one trace
    that ``trace`` then returns, the same graph as a trace started when asked, and this
    process never imports torch for it."""
    ahead = model_module.load_model(tiny)
    ahead.start_trace(256)
    assert len(traces) == 1
    graph = ahead.trace(256)
    assert len(traces) == 1 and trace_cache.load(tiny, 256, "bf16") == graph  # and stored
    assert model_module.load_model(tiny, cache=False).trace(256) == graph
    done = subprocess.run([sys.executable, "-c", STARTED_AHEAD.format(path=str(tiny))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(graph.layers)),
                                   str(sum(layer.num_params for layer in graph.layers))]


def test_a_trace_started_ahead_raises_its_error_when_asked(tmp_path):
    broken = tmp_path / "model.py"
    broken.write_text("def build_model():\n    raise RuntimeError('boom')\n")
    model = model_module.load_model(broken, cache=False)
    model.start_trace(256)  # nothing raised yet: the child works on
    with pytest.raises(model_module.ModelFileError, match="build_model\\(\\) raised RuntimeError: boom"):
        model.trace(256)


def test_verbose_says_what_the_search_did_and_keeps_stdout(tiny, monkeypatch):
    plain, quiet = _solve_json(tiny)
    verbose, said = _solve_json(tiny, "--verbose")
    assert verbose == plain
    assert "INFO" not in quiet
    for words in ("from the cache", "bounded", "shapes by physics", "pruned",
                  "never expanded", "stopped because"):
        assert words in said, said
