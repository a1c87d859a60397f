"""Reports that say what matters at every scale (issue 14 item 17): tiny models in sensible
units, the slow inter-node link in solve's report too, near misses with the digits that show
them, piped tables not cut to 80 columns."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.explain import need_against_limit
from autoplan.units import format_count, format_seconds

TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
TEN_GBE = "examples/clusters/pcie-x2-10gbe.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def test_counts_and_durations_take_their_scale():
    assert (format_count(12_345_678), format_count(1.2e9), format_count(125_000)) == \
        ("12.3M", "1.2B", "125K")
    assert (format_seconds(2.5), format_seconds(0.0123), format_seconds(4.5e-4)) == \
        ("2.500 s", "12.3 ms", "450 µs")


def test_a_tiny_model_is_reported_in_millions_and_milliseconds():
    result = CliRunner().invoke(app, ["solve", TINY, DGX1, "--seq-len", "256",
                                      "--global-batch", "16"])
    assert result.exit_code == 0, result.output
    assert "(957K parameters)" in result.output  # sum of the trace's layer parameters
    assert " ms" in result.output.split("step time")[1].splitlines()[0]


def test_solve_warns_about_a_ten_gigabit_link():
    """pcie-x2-10gbe: two nodes over 10 Gb/s Ethernet; a plan on both crosses it."""
    result = CliRunner().invoke(app, ["solve", TINY, TEN_GBE, "--seq-len", "256",
                                      "--global-batch", "16", "--dp", "16"])
    assert result.exit_code == 0, result.output
    assert "slow inter-node link: 10 Gb/s per NIC" in " ".join(result.output.split())


def test_a_near_miss_shows_the_digits_that_make_it_a_miss():
    # 80.04 GiB is 0.04 * 1024 = 41 MiB over 80 GiB; one decimal would print 80.0 for both.
    assert need_against_limit(80.04, 80.0) == "80.04 GiB (limit 80.0 GiB, 41 MiB over)"
    assert need_against_limit(115.9, 80.0) == "115.9 GiB (limit 80.0 GiB)"


def test_a_piped_trace_table_is_not_cut_to_80_columns():
    result = CliRunner().invoke(app, ["trace", TINY, "--seq-len", "256"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "layer" in line and "kind" in line)
    assert "boundary MiB" in header and "TP split" in header and len(header) > 80


def test_a_tiny_models_trace_counts_its_flops_in_their_unit():
    """957K parameters: 604 MFLOP forward, not "0.00 TFLOP"; the printed total agrees with
    the JSON document's count to the three digits shown."""
    text = CliRunner().invoke(app, ["trace", TINY, "--seq-len", "256"])
    doc = json.loads(CliRunner().invoke(app, ["trace", TINY, "--seq-len", "256", "--json"]).stdout)
    assert text.exit_code == 0, text.output
    total = next(line for line in text.output.splitlines() if line.startswith("total:"))
    forward = total.split("parameters, ")[1].split(" forward")[0]
    value, unit = forward.split()
    scale = {"MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12}[unit]
    assert float(value) * scale == pytest.approx(doc["fwd_flops"], rel=5e-3)
    # a block at 256 tokens, hidden 128: its Linears 2 x 256 x 12 x 128^2 = 100.7M plus the
    # attention scores and mix 2 x 2 x 256^2 x 128 = 33.6M, 134 MFLOP
    assert unit == "MFLOP" and "134 MFLOP" in text.output


def test_explaining_a_tiny_plan_prints_no_zero_seconds(tmp_path):
    """Every duration of the report and the explanation in the unit that shows its digits: no
    "0.005 s" (nor "0.000 s") for a step of milliseconds."""
    solved = CliRunner().invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                      "16", "--json"])
    path = tmp_path / "plan.json"
    path.write_text(solved.stdout)
    report = CliRunner().invoke(app, ["solve", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                      "16"])
    explained = CliRunner().invoke(app, ["explain", str(path), "--model", TINY])
    assert explained.exit_code == 0, explained.output
    for output in (report.output, explained.output):
        assert " ms" in output and not re.search(r"\b0\.\d+ s\b", output)
