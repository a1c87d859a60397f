"""autoplan calibrate --runs: reading runs and logs, the fit, --profile and its warnings."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.fit import loosest, mean_abs_error, memory_margin, pivot_order, predict
from autoplan.plugins.training_logs import read_training_log
from autoplan.run_profile import FitFigures, FittedOn, RunsProfile
from autoplan.runs import HEADER, RunsError, read_runs
from autoplan.calibration_runs import fit_runs

DATA = Path(__file__).parent / "data" / "calibration"
LLMF = DATA / "llmf_h100"
LOGS = DATA / "logs"
runner = CliRunner()


def _runs_csv(folder: Path, rows: list[str], header: str = ",".join(HEADER)) -> Path:
    """A runs.csv in ``folder`` beside copies of the MPT-760M model and the H100 clusters."""
    for name in ("mpt_760m.py", "mpt_1b.py", "h100-x1.yaml", "h100-x2.yaml"):
        shutil.copy(LLMF / name, folder / name)
    path = folder / "runs.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _profile(parameters: dict, **fitted_on) -> RunsProfile:
    where = {"gpu": "h100-sxm5-80gb", "runtime": "fsdp", "gpus": (8, 16),
             "params": (7e8, 1.5e9), "runs": 3, **fitted_on}
    return RunsProfile(parameters=parameters, fitted_on=FittedOn(**where),
                       fit=FitFigures(loss="soft_l1", f_scale=0.05, mean_abs_error_before=0.2,
                                      mean_abs_error_after=0.01), source="test-profile.yaml")


# --- training logs ------------------------------------------------------------------------


def test_megatron_log_median_step_after_the_first_interval_and_max_reserved_over_ranks():
    run = read_training_log(LOGS / "megatron.log")
    # intervals 2400 (start-up, dropped), 1000, 1100, 1050 ms -> median 1050 ms
    assert run.step_time_s == pytest.approx(1.050)
    # max reserved of ranks 0 and 1: 16334 and 17408 MB -> 17408 / 1024 = 17.0 GiB
    assert run.peak_memory_gib == pytest.approx(17.0)
    assert run.global_batch == 64 and run.tflops_per_gpu == pytest.approx(118.5)


def test_megatron_mem_max_reserved_bytes_line_is_the_peak(tmp_path):
    """The issue's ``mem-max-reserved-bytes`` (Megatron's name for
    memory_stats()["reserved_bytes.all.peak"], as its TensorBoard/W&B exports print it)."""
    log = tmp_path / "train.log"
    log.write_text((LOGS / "megatron.log").read_text().replace("max reserved: 17408.00", "max "
                   "reserved: 100.00") + "mem-max-reserved-bytes: 18253611008\n")
    # 18253611008 B = 17 * 2**30 B, above the MB report's 16334 MB = 15.95 GiB
    assert read_training_log(log).peak_memory_gib == pytest.approx(17.0)


@pytest.mark.parametrize("name, config, pattern, zero", [
    ("megatron", "megatron.sh", r"\(ms\): [0-9.]+", "(ms): 0.0"),
    ("torchtitan", "torchtitan.args", r"tps: [0-9,]+", "tps: 0"),
])
def test_a_log_with_zero_throughput_exits_2_naming_the_log(tmp_path, name, config, pattern, zero):
    """The issue's "a throughput of zero", for logs: every elapsed time per iteration 0 ms
    (Megatron-LM) or every tps 0 (torchtitan) would divide by zero or fit nothing."""
    shutil.copy(LOGS / config, tmp_path / config)
    log = tmp_path / f"{name}.log"
    log.write_text(re.sub(pattern, zero, (LOGS / f"{name}.log").read_text()))
    result = runner.invoke(app, ["calibrate", "--runs", str(log), "--model",
                                 str(LLMF / "mpt_760m.py"), "--cluster", str(LLMF / "h100-x1.yaml"),
                                 "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"{name}.log" in message and " 0" in message and "Traceback" not in result.output
    assert not (tmp_path / "p.yaml").exists()


def test_torchtitan_log_tps_and_memory_through_ansi_colours():
    run = read_training_log(LOGS / "torchtitan.log")
    assert run.tokens_per_s_per_gpu == 6321  # median of 6,321 6,400 6,300 (step 1 dropped)
    assert run.peak_memory_gib == pytest.approx(35.5)


def test_megatron_bridge_memory_report_in_gigabytes_is_the_peak(tmp_path):
    """Megatron-Bridge's report_memory (train_utils.py) prints memory_stats() bytes / 1.0e9
    rounded to 5 significant digits under the name with "bytes" replaced by "gigabytes", after
    "[Rank R] (after N iterations) memory (GB)"; its iteration line is Megatron-LM's."""
    iterations = [line for line in (LOGS / "megatron.log").read_text().splitlines()
                  if "elapsed time per iteration" in line]
    # reserved_bytes.all.peak = 18253611008 -> 18.253611008 GB -> round(., 3) = 18.254
    memory = ("[Rank 0] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 9.7876 | "
              "mem-max-allocated-gigabytes: 16.52 | mem-max-reserved-gigabytes: 18.254 | "
              "mem-alloc-retires: 0 | mem-allocated-count: 5000")
    log = tmp_path / "bridge.log"
    log.write_text("\n".join([iterations[0], memory, *iterations[1:]]) + "\n")
    # 18.254e9 B / 2**30 B per GiB = 17.0004 GiB
    assert read_training_log(log).peak_memory_gib == pytest.approx(17.0004, abs=1e-4)


def test_torchtitan_lines_printed_by_torchtitans_own_metrics_log(tmp_path, caplog, monkeypatch):
    """The step lines come from torchtitan's MetricsProcessor.log itself (its f-string, its
    24-bit colours), fed a stub of the state it reads: tps = tokens since the last log /
    (seconds * non-data-parallel size)."""
    metrics = pytest.importorskip("torchtitan.components.metrics")
    from torchtitan.tools.utils import Color

    monkeypatch.setattr(metrics, "time", SimpleNamespace(perf_counter=lambda: 100.0))
    peaks = iter([30.0, 35.12, 35.5, 35.25])
    lines = []
    for step, tokens in ((1, 24_000), (10, 126_420), (20, 128_000), (30, 126_000)):
        reserved = next(peaks)
        stub = SimpleNamespace(
            num_flops_per_token=6 * 7.6e8, time_last_log=90.0, ntokens_since_last_log=tokens,
            parallel_dims=SimpleNamespace(non_data_parallel_size=2), has_quantization=False,
            gpu_peak_flops=989e12, config=SimpleNamespace(log_freq=10), data_loading_times=[0.1],
            device_memory_monitor=SimpleNamespace(
                get_peak_stats=lambda r=reserved: metrics.DeviceMemStats(r - 2, 0, r, 0, 0, 0),
                reset_peak_stats=lambda: None),
            logger=SimpleNamespace(log=lambda *args: None), color=Color())
        caplog.clear()
        with caplog.at_level(logging.INFO):
            metrics.MetricsProcessor.log(stub, step, 7.8, 8.0, 1.2)
        lines += [r.getMessage() for r in caplog.records]
    log = tmp_path / "titan.log"
    log.write_text("\n".join(lines) + "\n")
    run = read_training_log(log)
    # tps per step: 24000/(10*2) = 1200 (dropped), 6321, 6400, 6300 -> median 6321
    assert run.tokens_per_s_per_gpu == 6321 and run.intervals == 4
    assert run.peak_memory_gib == pytest.approx(35.5)  # the largest "memory: 35.50GiB"


def test_a_log_becomes_a_run_with_its_configuration_beside_it():
    [run] = read_runs(LOGS / "megatron.log", model=LLMF / "mpt_760m.py",
                      cluster=LLMF / "h100-x1.yaml")
    assert (run.seq_len, run.global_batch, run.runtime) == (1024, 64, "megatron")
    assert run.pins["tp"] == 4 and run.pins["mbs"] == 2 and run.pins["zero"] == 1
    assert run.step_time_s == pytest.approx(1.05) and run.tokens_per_s_per_gpu is None


def test_a_log_without_its_configuration_is_refused(tmp_path):
    shutil.copy(LOGS / "torchtitan.log", tmp_path / "alone.log")
    with pytest.raises(RunsError, match="configuration next to it"):
        read_runs(tmp_path / "alone.log", model=LLMF / "mpt_760m.py",
                  cluster=LLMF / "h100-x1.yaml")


# --- bad runs.csv: exit 2, the row and the column named ----------------------------------

GOOD = "mpt_760m.py,h100-x1.yaml,2048,384,1,1,8,1,24,3,none,false,fsdp,63147,"


def test_the_header_is_the_issues_contract():
    """Issue 18 writes the header out; external checks rely on it character for character."""
    assert ",".join(HEADER) == ("model,cluster,seq_len,global_batch,tp,pp,dp,cp,mbs,zero,"
                                "recompute,sp,runtime,tokens_per_s_per_gpu,peak_memory_gib")


@pytest.mark.parametrize("header, row, expected", [
    (",".join(HEADER[:-1]), GOOD[:-1], "missing column(s) peak_memory_gib"),
    (",".join(HEADER) + ",notes", GOOD + ",x", "unknown column(s) notes"),
    (",".join(HEADER).replace("tp,pp", "pp,tp"), GOOD, "row 1 (header): the columns are "
     "repeated or in another order"),
    (None, GOOD.replace(",63147,", ",0,"), "row 2, column tokens_per_s_per_gpu"),
    (None, GOOD.replace(",63147,", ",inf,"), "row 2, column tokens_per_s_per_gpu"),
    (None, GOOD + "nan", "row 2, column peak_memory_gib"),
    (None, GOOD.replace(",none,", ",partial,"), "row 2, column recompute"),
    (None, GOOD.replace(",false,", ",maybe,"), "row 2, column sp"),
    (None, GOOD.replace("mpt_760m.py", "absent.py"), "row 2, column model: no such file"),
    (None, GOOD.replace(",1,1,8,1,", ",1,1,16,1,"), "row 2, columns tp,pp,dp,cp"),
    (None, "mpt_760m.py,h100-x1.yaml,2048", "row 2: 3 cells, but the header has 15 columns"),
])
def test_bad_rows_exit_2_naming_row_and_column(tmp_path, header, row, expected):
    path = _runs_csv(tmp_path, [row], header or ",".join(HEADER))
    result = runner.invoke(app, ["calibrate", "--runs", str(path), "--out",
                                 str(tmp_path / "p.yaml")])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "p.yaml").exists()


def test_a_model_that_fails_to_trace_names_its_row(tmp_path):
    path = _runs_csv(tmp_path, [GOOD.replace("mpt_760m.py", "broken.py"), GOOD])
    (tmp_path / "broken.py").write_text("def build_model():\n    raise RuntimeError('boom')\n")
    result = runner.invoke(app, ["calibrate", "--runs", str(path), "--out",
                                 str(tmp_path / "p.yaml")])
    assert result.exit_code == 2, result.output
    assert "row 2, column model" in " ".join(result.output.split())
    assert "boom" in result.output


def test_an_existing_profile_is_not_overwritten_without_force(tmp_path):
    path = _runs_csv(tmp_path, [GOOD])
    (tmp_path / "p.yaml").write_text("mine\n")
    result = runner.invoke(app, ["calibrate", "--runs", str(path), "--out",
                                 str(tmp_path / "p.yaml")])
    assert result.exit_code == 2 and (tmp_path / "p.yaml").read_text() == "mine\n"


# --- the fit ------------------------------------------------------------------------------

def assert_recovers(profile: RunsProfile, truth: dict) -> None:
    """The fit chose every parameter of ``truth``, found each within 2%, and so predicts its
    own generated runs almost exactly (they were far off with the catalog's values)."""
    assert set(truth) <= set(profile.parameters), profile.fixed
    for name, value in truth.items():
        assert profile.parameters[name] == pytest.approx(value, rel=0.02), name
    assert profile.fit.mean_abs_error_after < 0.005 < profile.fit.mean_abs_error_before


TRUTH = {"gemm_efficiency": 0.55, "attention_efficiency": 0.40, "memory_fragmentation": 0.25}
"""A known parameter set, away from the catalog's H100 and fsdp values (0.69, 0.30, 0.10)."""

SHAPES = [  # seq_len, global batch, dp, mbs, recompute, cluster: runs that move the two apart
    (1024, 64, 8, 8, "none", "h100-x1.yaml"), (4096, 32, 8, 4, "none", "h100-x1.yaml"),
    (4096, 16, 8, 2, "full", "h100-x1.yaml"), (1024, 128, 16, 8, "full", "h100-x2.yaml"),
]


def test_round_trip_recovers_the_parameters_that_generated_the_runs(tmp_path):
    """Runs whose throughput and allocator-reserved peak estimate() predicts under TRUTH (and a
    CUDA context of 3 GiB); the fit must find TRUTH: kernel efficiencies from the throughputs,
    the allocator's fragmentation from the reserved peaks, and leave the CUDA context, which
    lies outside the allocator and so outside what runs.csv's peak_memory_gib measures, at the
    catalog's value."""
    _runs_csv(tmp_path, [])
    rows = []
    for seq, batch, dp, mbs, recompute, cluster in SHAPES:
        made = api.estimate(tmp_path / "mpt_760m.py", tmp_path / cluster,
                            {"dp": dp, "mbs": mbs, "zero": 3, "recompute": recompute},
                            seq_len=seq, global_batch=batch, runtime="fsdp",
                            profile=_profile({**TRUTH, "cuda_context_bytes": 3.0 * 2**30}))
        tokens = made.estimate.tokens_per_s / made.plan.world_size
        rows.append(f"mpt_760m.py,{cluster},{seq},{batch},1,1,{dp},1,{mbs},3,{recompute},"
                    f"false,fsdp,{tokens},{made.estimate.peak_reserved_gib}")
    path = _runs_csv(tmp_path, rows)
    profile = api.calibrate_runs([path], tmp_path / "p.yaml", leave_one_out=False)
    assert_recovers(profile, TRUTH)
    assert profile.fit.memory_mean_abs_error_after < 0.005 < profile.fit.memory_mean_abs_error_before
    assert profile.fixed["cuda_context_bytes"] == "no run's prediction depends on it"
    assert len(profile.parameters) - 1 < len(rows)  # never one knob per run (of time)


def test_calibrating_on_published_rows_lowers_the_error_on_held_out_rows(tmp_path):
    """llm-foundry H100 rows (tests/data/calibration/llmf_h100): MPT-760M and MPT-1B, three
    rows each to calibrate (seq 512-4096), six others of theirs held out."""
    lines = (LLMF / "runs.csv").read_text().splitlines()
    row = {f"LLMF-H100-{k:02d}": lines[k] for k in range(1, len(lines))}
    train = ["LLMF-H100-47", "LLMF-H100-48", "LLMF-H100-52",
             "LLMF-H100-37", "LLMF-H100-40", "LLMF-H100-43"]
    held = ["LLMF-H100-49", "LLMF-H100-50", "LLMF-H100-51",
            "LLMF-H100-39", "LLMF-H100-41", "LLMF-H100-42"]
    for source in [LLMF / "mpt_760m.py", LLMF / "mpt_1b.py", *LLMF.glob("h100-x*.yaml")]:
        shutil.copy(source, tmp_path / source.name)
    calibration = tmp_path / "train.csv"
    calibration.write_text("\n".join([lines[0], *(row[r] for r in train)]) + "\n")
    held_out = tmp_path / "held.csv"
    held_out.write_text("\n".join([lines[0], *(row[r] for r in held)]) + "\n")
    profile = api.calibrate_runs([calibration], tmp_path / "p.yaml")
    runs = fit_runs(read_runs(held_out))
    measured = [r.tokens_per_s_per_gpu for r in runs]
    before = mean_abs_error([predict(r, {}).tokens_per_s_per_gpu for r in runs], measured)
    after = mean_abs_error([predict(r, profile.parameters).tokens_per_s_per_gpu for r in runs],
                           measured)
    assert after < before
    assert profile.fit.loro_mean_abs_error is not None
    written = (tmp_path / "p.yaml").read_text()
    assert "fitted_on" in written and "h100-sxm5-80gb" in written and "loro_mean_abs_error" in written


# --- --profile: applied, and warned about where it may not hold ---------------------------


def test_profile_applies_its_parameters_and_stays_quiet_inside_its_range(tmp_path):
    _runs_csv(tmp_path, [])
    args = dict(seq_len=2048, global_batch=64, runtime="fsdp")
    pins = {"dp": 8, "mbs": 8, "zero": 3}
    plain = api.estimate(tmp_path / "mpt_760m.py", tmp_path / "h100-x1.yaml", pins, **args)
    slower = api.estimate(tmp_path / "mpt_760m.py", tmp_path / "h100-x1.yaml", pins,
                          profile=_profile({"gemm_efficiency": 0.35}), **args)
    assert slower.estimate.step_time_s > plain.estimate.step_time_s
    assert "calibration" not in plain.model_dump(mode="json")
    assert slower.calibration.warnings == []


def test_profile_on_another_gpu_runtime_or_scale_warns_in_json_and_report(tmp_path):
    _runs_csv(tmp_path, [])
    (tmp_path / "a100.yaml").write_text(
        "gpu: a100-sxm4-80gb\nnodes: 8\ngpus_per_node: 8\n"
        "intra_node: {link: nvswitch, bandwidth: 300GB/s}\n"
        "inter_node: {link: infiniband, nics_per_node: 8, bandwidth: 200Gbps}\n")
    profile = tmp_path / "profile.yaml"
    from autoplan.run_profile import write_runs_profile
    write_runs_profile(_profile({"gemm_efficiency": 0.6}), profile)
    base = ["estimate", str(tmp_path / "mpt_760m.py"), str(tmp_path / "a100.yaml"),
            "--seq-len", "2048", "--global-batch", "64", "--runtime", "megatron",
            "--profile", str(profile)]
    result = runner.invoke(app, base + ["--json"])
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.output)["calibration"]["warnings"]
    text = " ".join(warnings)
    assert "fitted on h100-sxm5-80gb but this cluster has a100-sxm4-80gb" in text
    assert "runtime fsdp" in text and "8-16 GPUs; this plan uses 64" in text
    report = runner.invoke(app, base)
    assert report.exit_code == 0 and "warning:" in report.output


def test_profile_fitted_on_larger_models_warns_of_the_model_size(tmp_path):
    """Same GPU, runtime and GPU count as the fit, but a model far below its size range:
    MPT-760M (about 7.6e8 parameters) against a fit on 1e10-2e10, more than SCALE_MARGIN (2x)
    below 1e10."""
    _runs_csv(tmp_path, [])
    made = api.estimate(tmp_path / "mpt_760m.py", tmp_path / "h100-x1.yaml",
                        {"dp": 8, "mbs": 8, "zero": 3}, seq_len=2048, global_batch=64,
                        runtime="fsdp", profile=_profile({"gemm_efficiency": 0.6},
                                                         gpus=(8, 8), params=(1e10, 2e10)))
    [warning] = made.calibration.warnings
    assert "fitted on models of 10B-20B parameters" in warning and "far outside" in warning


def test_logs_of_two_runtimes_are_not_fitted_together(tmp_path):
    """The Megatron-LM log (runtime megatron) and the torchtitan one (fsdp) on one cluster."""
    result = runner.invoke(app, [
        "calibrate", "--runs", str(LOGS / "megatron.log"), "--runs", str(LOGS / "torchtitan.log"),
        "--model", str(LLMF / "mpt_760m.py"), "--cluster", str(LLMF / "h100-x1.yaml"),
        "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2, result.output
    assert "column runtime: fsdp, but" in " ".join(result.output.split())


def test_a_small_distinct_effect_is_separable_and_a_rescaled_copy_is_not():
    """Columns: a moves every run alike; b moves them 20x less but in a pattern of its own;
    c is 2a. Worked by hand: c has the largest norm (4) and goes first; after it b's residual
    is all of b (orthogonal to c, length 0.2) and a's is 0 (a = c/2), so b comes next and is
    separable although its length is 5% of c's, and a last, not separable."""
    a = np.array([1.0, 1.0, 1.0, 1.0])
    b = 0.1 * np.array([1.0, -1.0, 1.0, -1.0])
    assert pivot_order(np.column_stack([a, b, 2 * a])) == [(2, True), (1, True), (0, False)]


def test_a_parameter_the_runs_pin_down_less_well_than_the_catalog_is_loosest():
    """Four runs each moving by s per unit of log GEMM efficiency: the fitted log value has the
    standard deviation F_SCALE / (s * sqrt(4)) = 0.05 / (2 s). The catalog's prior factor 1.3
    allows log(1.3) = 0.2624: s = 0.1 gives 0.25 (pinned), s = 0.09 gives 0.2778 (a factor
    exp(0.2778) = 1.320, loosest). Beside it a column that copies it but for 1% of one run
    inflates both deviations past any prior."""
    names = ["gemm_efficiency", "attention_efficiency"]
    assert loosest(np.full((4, 1), 0.1), [0], names) is None
    name, factor = loosest(np.full((4, 1), 0.09), [0], names)
    assert name == "gemm_efficiency" and factor == pytest.approx(1.320, abs=1e-3)
    nearly = np.column_stack([np.full(4, 0.5), [0.5, 0.5, 0.5, 0.505]])
    assert loosest(nearly, [0, 1], names) is not None


def test_memory_margin_is_median_plus_two_robust_deviations_of_the_underprediction():
    """Measured 11, 10, 9 and 14 GiB against 10 predicted each: shares 0.1, 0, -0.1, 0.4;
    median 0.05, absolute deviations 0.05, 0.05, 0.15, 0.35, their median 0.1, so the margin
    is 0.05 + 2 * 1.4826 * 0.1 = 0.3465 (the 40% run does not set it alone); a run without
    memory does not count; errors that all over-predict need no margin."""
    runs = [SimpleNamespace(peak_memory_gib=m) for m in (11.0, 10.0, 9.0, 14.0, None)]
    predicted = [SimpleNamespace(peak_memory_gib=10.0)] * 5
    assert memory_margin(runs, predicted) == pytest.approx(0.05 + 2 * 1.4826 * 0.1)
    over = [SimpleNamespace(peak_memory_gib=m) for m in (8.0, 9.0)]
    assert memory_margin(over, predicted[:2]) == 0.0


def test_a_profiles_memory_margin_refuses_a_plan_that_fits_only_without_it(tmp_path):
    """A plan with a peak of P GiB under a limit of L fits; with a margin m the limit is
    L / (1 + m), so m just above L / P - 1 makes it not fit and just below keeps it."""
    _runs_csv(tmp_path, [])
    args = dict(seq_len=2048, global_batch=64, runtime="fsdp")
    pins = {"dp": 8, "mbs": 8, "zero": 3}
    plain = api.estimate(tmp_path / "mpt_760m.py", tmp_path / "h100-x1.yaml", pins, **args)
    assert plain.estimate.feasible
    ratio = plain.estimate.memory_limit_gib / plain.estimate.peak_memory_gib - 1
    for margin, fits in ((ratio * 0.99, True), (ratio * 1.01, False)):
        profile = _profile({}).model_copy(update={"memory_margin": margin})
        made = api.estimate(tmp_path / "mpt_760m.py", tmp_path / "h100-x1.yaml", pins,
                            profile=profile, **args)
        assert made.estimate.feasible is fits, margin


TINY_LLAMA = '''from autoplan.zoo import Llama, LlamaConfig, next_token_loss
CONFIG = LlamaConfig(num_layers=4, hidden_size=2048, num_heads=32, num_kv_heads=32,
                     ffn_hidden_size=5632, vocab_size=32000)
def build_model():
    return Llama(CONFIG)
def loss(output, inputs):
    return next_token_loss(output, inputs)
'''

NETWORK_TRUTH = {"inter_node_efficiency": 0.4, "inter_node_net_latency_s": 2.5e-4}
"""A slower EFA fabric than the catalog's (0.85 of 32 x 100 Gb/s, 75 us per network step).
(Megatron's element-wise kernels, Transformer Engine's fused ones, are too small a share of
these steps for the runs to pin their efficiency as well: costmodels/fused_kernels.py.)"""

NETWORK_SHAPES = [  # nodes, tp, dp, seq, global batch, mbs: TP across nodes, latency- and
    (1, 8, 1, 2048, 64, 4), (2, 16, 1, 1024, 32, 1),  # bandwidth-bound (small and large
    (2, 16, 1, 4096, 32, 4), (4, 32, 1, 2048, 32, 2), (4, 8, 4, 2048, 64, 2),  # messages)
]


def _network_runs(folder: Path, truth: dict, shapes: list[tuple] = NETWORK_SHAPES) -> Path:
    """A runs.csv of ``shapes`` on p5-like nodes (EFA; the one-node cluster.yaml has no
    network at all) whose throughput estimate() predicts under ``truth``."""
    (folder / "tiny.py").write_text(TINY_LLAMA)
    for nodes in sorted({shape[0] for shape in shapes}):
        network = ("" if nodes == 1 else
                   "inter_node: {link: efa, nics_per_node: 32, bandwidth: 100Gbps}\n")
        (folder / f"p5-x{nodes}.yaml").write_text(
            f"name: p5-x{nodes}\ngpu: h100-sxm5-80gb\nnodes: {nodes}\ngpus_per_node: 8\n"
            f"intra_node: {{link: nvswitch, bandwidth: 450GB/s}}\n{network}")
    rows = []
    for nodes, tp, dp, seq, batch, mbs in shapes:
        made = api.estimate(folder / "tiny.py", folder / f"p5-x{nodes}.yaml",
                            {"tp": tp, "dp": dp, "mbs": mbs, "zero": 0}, seq_len=seq,
                            global_batch=batch, runtime="megatron",
                            profile=_profile(truth, runtime="megatron"))
        tokens = made.estimate.tokens_per_s / made.plan.world_size
        rows.append(f"tiny.py,p5-x{nodes}.yaml,{seq},{batch},{tp},1,{dp},1,{mbs},0,none,false,"
                    f"megatron,{tokens},")
    path = folder / "runs.csv"
    path.write_text("\n".join([",".join(HEADER), *rows]) + "\n")
    return path


def test_round_trip_recovers_the_network_of_runs_with_tp_across_nodes(tmp_path):
    """The fit recovers NETWORK_TRUTH: the NIC efficiency and the latency per network step of
    NCCL's collectives across nodes as well as the GEMM efficiency, although the first run
    (one node, no network in its cluster.yaml) has no place for the network parameters."""
    path = _network_runs(tmp_path, NETWORK_TRUTH)
    profile = api.calibrate_runs([path], tmp_path / "p.yaml", leave_one_out=False)
    assert_recovers(profile, NETWORK_TRUTH)


SPAN_TRUTH = {"inter_node_efficiency": 0.5, "inter_node_kept_per_doubling": 0.85}
"""A network that keeps 0.85 of its busbw per doubling of a ring's nodes (p5's catalog EFA:
0.965) on NICs at 0.5 of their rate (catalog 0.80)."""

SPAN_SHAPES = [  # nodes, tp, dp, seq, global batch, mbs: one node (the GEMMs), then data
    (1, 8, 1, 1024, 8, 1), (2, 8, 2, 1024, 2, 1),  # parallelism over 2 to 16 nodes, one
    (4, 8, 4, 1024, 4, 1), (8, 8, 8, 1024, 8, 1),  # sequence per rank: a gradient all-reduce
    (16, 8, 16, 1024, 16, 1),  # over as many nodes that the step's compute barely hides
]


def test_round_trip_recovers_the_loss_per_doubling_of_nodes(tmp_path):
    """Runs whose gradient all-reduce spans 2, 4, 8 and 16 nodes tell the network's loss per
    doubling of the nodes apart from its efficiency (the 2-node run sees only the efficiency:
    0.85 ** log2(2 / 2) = 1; the 16-node one 0.85 ** 3 = 0.61 of it), and the fit finds both
    (the runs were 44% off with the catalog's values)."""
    path = _network_runs(tmp_path, SPAN_TRUTH, SPAN_SHAPES)
    profile = api.calibrate_runs([path], tmp_path / "p.yaml", leave_one_out=False)
    assert_recovers(profile, SPAN_TRUTH)


def test_rings_of_one_span_leave_the_loss_per_doubling_at_the_catalog_value(tmp_path):
    """Every run's data-parallel ring over the same 4 nodes: the loss per doubling and the NIC
    efficiency move their throughputs identically, so the fit keeps the loss at the catalog's
    and puts what the runs saw into the efficiency, which does not extrapolate to other node
    counts: 0.5 * 0.85 (the truth at one doubling) / 0.965 (catalog p5 EFA) = 0.4404."""
    shapes = [(4, 8, 4, 1024, 4, 1), (4, 8, 4, 2048, 8, 2), (4, 8, 4, 1024, 16, 4),
              (4, 8, 4, 4096, 4, 1)]
    path = _network_runs(tmp_path, SPAN_TRUTH, shapes)
    profile = api.calibrate_runs([path], tmp_path / "p.yaml", leave_one_out=False)
    assert "inter_node_kept_per_doubling" not in profile.parameters
    assert "cannot tell it apart" in profile.fixed["inter_node_kept_per_doubling"]
    assert profile.parameters["inter_node_efficiency"] == pytest.approx(0.4404, rel=1e-3)
