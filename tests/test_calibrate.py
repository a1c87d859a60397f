"""`autoplan calibrate`: the profile it writes loads back, its fit reproduces what it measured,
and a profile changes estimates the way it says it should."""

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from autoplan.calibrate import GemmPoint, MeasuredProfile, fit_gemm, load_profile
from autoplan.cli import app

runner = CliRunner()
TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("calibrate") / "profile.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(path)])
    assert result.exit_code == 0, result.output
    return path


def _model_time(flops, efficiency, half, peak):
    # compute.py's GEMM curve, written out again: eff(f) = eff * f / (f + half).
    return flops / (peak * efficiency * flops / (flops + half))


def test_written_profile_loads_back(written):
    document = yaml.safe_load(written.read_text())
    measured = MeasuredProfile.model_validate(document)
    assert measured.device == "cpu" and measured.gpu is None
    profile = load_profile(written)
    assert profile.gemm_efficiency == pytest.approx(document["fitted"]["gemm_efficiency"])
    assert profile.gemm_half_flops == pytest.approx(document["fitted"]["gemm_half_flops"])
    assert profile.memory_efficiency == pytest.approx(1.0)  # CPU: measured is the reference


def test_fit_is_numpys_weighted_least_squares_on_the_measured_points(written):
    measured = MeasuredProfile.model_validate(yaml.safe_load(written.read_text()))
    flops = np.array([p.flops for p in measured.gemm])
    seconds = np.array([p.seconds for p in measured.gemm])
    slope, intercept = np.polyfit(flops, seconds, 1, w=1 / seconds)
    efficiency, half = fit_gemm(measured.gemm, measured.peak_flops)
    if intercept > 0:
        assert efficiency == pytest.approx(1 / (slope * measured.peak_flops), rel=1e-6)
        assert half == pytest.approx(intercept / slope, rel=1e-6)
    predicted = _model_time(flops, efficiency, half, measured.peak_flops)
    relative = np.abs(predicted - seconds) / seconds
    # Tiny CPU GEMMs are noisy; the curve still has to follow them, not just exist.
    assert np.sqrt(np.mean(relative**2)) < 1.0


def test_fit_recovers_a_known_curve():
    peak, efficiency, half = 312e12, 0.74, 2.0e9
    points = [GemmPoint(m=n, n=n, k=n, seconds=_model_time(2.0 * n**3, efficiency, half, peak))
              for n in (128, 512, 2048, 8192)]
    fitted = fit_gemm(points, peak)
    assert fitted == pytest.approx((efficiency, half), rel=1e-9)


def _step_time(*extra):
    result = runner.invoke(app, ["estimate", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16", "--json", *map(str, extra)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["estimate"]["step_time_s"]


def test_a_slower_gemm_profile_gives_a_slower_step(written, tmp_path):
    document = yaml.safe_load(written.read_text())
    for point in document["gemm"]:
        point["seconds"] *= 3  # the same shapes, three times slower: a third of the efficiency
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(document))
    assert load_profile(slow).gemm_efficiency == pytest.approx(
        load_profile(written).gemm_efficiency / 3, rel=1e-9)
    assert _step_time("--profile", slow) > _step_time("--profile", written)


def test_a_missing_profile_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["estimate", TINY, DGX1, "--seq-len", "256", "--global-batch",
                                 "16", "--profile", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2
    assert "autoplan calibrate" in result.output
