"""Importers: a configuration exported by autoplan reads back into the same plan, and the
current setup of a user is priced against the optimum."""

import json

import pytest
from typer.testing import CliRunner

import autoplan
from autoplan.cli import app
from autoplan.errors import PlanFileError
from autoplan.plugins import export_plan
from autoplan.plugins.importers import read_run
from tests.extras import require

TINY = "examples/models/tiny_gpt.py"
DGX1 = "examples/clusters/dgx-a100-x1.yaml"
TWO = "examples/clusters/pcie-x2-10gbe.yaml"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, examples):
    monkeypatch.chdir(examples.parent)


def round_trip(tmp_path, target, filename, pins, cluster=DGX1, runtime="megatron", batch=16):
    planned = autoplan.estimate(TINY, cluster, pins, seq_len=256, global_batch=batch,
                                runtime=runtime)
    export_plan(planned, target, tmp_path)
    imported = autoplan.estimate(TINY, cluster, read_run(tmp_path / filename), seq_len=256,
                                 global_batch=batch, runtime=runtime)
    return planned.plan, imported.plan


@pytest.mark.parametrize("pins", [
    {"tp": 2, "pp": 2, "mbs": 2, "zero": 1, "recompute": "selective", "sp": True},
    {"tp": 1, "pp": 4, "mbs": 1, "recompute": "full"},
    {"tp": 1, "pp": 2, "mbs": 1, "recompute": "full", "recompute_num_layers": 1},
    {"tp": 2, "pp": 1, "mbs": 4, "zero": 0},
    {"tp": 2, "pp": 2, "mbs": 1, "placement": "tp-cp-pp-dp"},
])
def test_megatron_arguments_round_trip(tmp_path, pins):
    planned, imported = round_trip(tmp_path, "megatron", "megatron_args.txt", pins)
    assert imported == planned


def test_megatron_uneven_stages_round_trip(tmp_path):
    model = autoplan.load_model("examples/models/gpt3_175b.py")
    cluster = "examples/clusters/dgx-a100-x128.yaml"
    result = autoplan.solve(model, cluster, seq_len=2048, global_batch=1536,
                            pins={"tp": 8, "pp": 8, "vpp": 1})
    export_plan(result, "megatron", tmp_path)
    imported = autoplan.estimate(model, cluster, read_run(tmp_path / "megatron_args.txt"))
    assert imported.plan.stages == result.plan.stages
    assert imported.estimate.step_time_s == pytest.approx(result.estimate.step_time_s)


def test_deepspeed_config_round_trip(tmp_path):
    pins = {"tp": 1, "pp": 1, "mbs": 2, "zero": 2, "recompute": "full"}
    planned, imported = round_trip(tmp_path, "deepspeed", "ds_config.json", pins,
                                   runtime="deepspeed")
    assert imported == planned


def test_torchtitan_overrides_round_trip(tmp_path):
    pins = {"tp": 2, "pp": 1, "mbs": 1, "zero": 3, "recompute": "full"}
    planned, imported = round_trip(tmp_path, "torchtitan", "torchtitan_args.txt", pins,
                                   runtime="fsdp")
    assert (imported.tp, imported.dp, imported.zero_stage, imported.recompute) == (
        planned.tp, planned.dp, planned.zero_stage, planned.recompute)


MIXTRAL = "examples/models/hf_mixtral_tiny.py"


@pytest.mark.parametrize("target, filename, runtime, pins", [
    ("megatron", "megatron_args.txt", "megatron",
     {"tp": 2, "pp": 1, "mbs": 1, "zero": 1, "sp": True, "ep": 4}),
    ("torchtitan", "torchtitan_args.txt", "fsdp", {"tp": 1, "pp": 1, "mbs": 1, "zero": 2, "ep": 2}),
])
def test_expert_parallel_degree_round_trips(tmp_path, target, filename, runtime, pins):
    require("transformers")
    planned = autoplan.estimate(MIXTRAL, DGX1, pins, seq_len=256, global_batch=16, runtime=runtime)
    export_plan(planned, target, tmp_path)
    imported = autoplan.estimate(MIXTRAL, DGX1, read_run(tmp_path / filename), seq_len=256,
                                 global_batch=16, runtime=runtime)
    assert (imported.plan.ep, imported.plan.tp, imported.plan.dp) == (
        planned.plan.ep, planned.plan.tp, planned.plan.dp)
    assert imported.estimate.step_time_s == pytest.approx(planned.estimate.step_time_s)


@pytest.mark.parametrize("target", ["deepspeed", "accelerate", "torchrun", "colossalai"])
def test_targets_without_expert_parallelism_refuse_it(tmp_path, target):
    require("transformers")
    from autoplan.errors import ExportError
    planned = autoplan.estimate(MIXTRAL, DGX1, {"tp": 1, "pp": 1, "ep": 2}, seq_len=256,
                                global_batch=16)
    with pytest.raises(ExportError, match="ep=2"):
        export_plan(planned, target, tmp_path)


def test_solve_from_a_file_says_what_to_change(tmp_path):
    args = tmp_path / "megatron_args.txt"
    args.write_text("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1\n"
                    "--micro-batch-size 1 --global-batch-size 16 --seq-length 256\n"
                    "--recompute-granularity full --recompute-method uniform --bf16\n")
    result = CliRunner().invoke(app, ["solve", TINY, DGX1, "--from", str(args)])
    assert result.exit_code == 0, result.output
    assert "Your current setup" in result.stdout and "as fast; change" in result.stdout
    assert "recompute full ->" in result.stdout


def test_unknown_files_are_refused_clearly(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(PlanFileError, match="Megatron-LM argument list"):
        read_run(path)


def _ds_config(tmp_path, **fields):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
                                **fields}))
    return path


def test_deepspeed_infers_gradient_accumulation_from_the_batch_as_deepspeed_does(tmp_path):
    # DeepSpeed runtime/config.py _set_batch_related_parameters: with train_batch_size 256 and
    # micro-batch 4 but no gradient_accumulation_steps, it sets 256 // 4 // dp; on the 8 GPUs
    # of DGX1, dp = 8 and accumulation 8 (256 = 4 x 8 x 8), not 1 (which needed dp = 64).
    path = _ds_config(tmp_path, train_batch_size=256, train_micro_batch_size_per_gpu=4)
    result = CliRunner().invoke(app, ["estimate", TINY, DGX1, "--from", str(path),
                                      "--seq-len", "256", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert (plan["dp"], plan["micro_batch_size"], plan["num_microbatches"]) == (8, 4, 8)
    assert "gradient_accumulation_steps inferred" in result.stderr


def test_deepspeed_auto_values_are_filled_from_the_run_as_the_hf_trainer_does(tmp_path):
    # The HF Trainer writes "auto" and fills it from its own arguments (batch, accumulation,
    # world size): here --global-batch and --mbs.
    path = _ds_config(tmp_path, train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                      gradient_accumulation_steps="auto")
    result = CliRunner().invoke(app, ["estimate", TINY, DGX1, "--from", str(path), "--seq-len",
                                      "256", "--global-batch", "64", "--mbs", "2", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert (plan["dp"], plan["micro_batch_size"], plan["num_microbatches"]) == (8, 2, 4)
    assert "auto" in result.stderr


def test_deepspeed_batch_fields_that_cannot_agree_are_refused(tmp_path):
    path = _ds_config(tmp_path, train_batch_size=100, train_micro_batch_size_per_gpu=3,
                      gradient_accumulation_steps=2)
    with pytest.raises(PlanFileError, match="DeepSpeed requires"):
        read_run(path)


def _megatron_args(tmp_path, extra: str):
    args = tmp_path / "megatron_args.txt"
    args.write_text("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1\n"
                    "--micro-batch-size 1 --global-batch-size 16 --seq-length 256\n"
                    f"--sequence-parallel --bf16 {extra}\n")
    return args


def test_megatron_framework_flags_become_the_runtime_settings_they_price(tmp_path):
    # Megatron-LM's --tp-comm-overlap is Transformer Engine's userbuffers overlap (runtime
    # setting tp_comm_overlap): the imported run is priced as if the setting were given, and a
    # config file the importer does not read is said.
    run = read_run(_megatron_args(tmp_path, "--tp-comm-overlap --tp-comm-overlap-cfg ub.yaml "
                                            "--transformer-impl transformer_engine"))
    assert run.runtime_settings == {"tp_comm_overlap": True,
                                    "transformer_impl": "transformer_engine"}
    assert any("--tp-comm-overlap-cfg not read" in note for note in run.notes)
    imported = autoplan.estimate(TINY, DGX1, run)
    plain = read_run(_megatron_args(tmp_path, ""))
    stated = autoplan.estimate(TINY, DGX1, plain, runtime_settings={"tp_comm_overlap": True})
    assert imported.estimate.step_time_s == stated.estimate.step_time_s
    without = autoplan.estimate(TINY, DGX1, plain)
    assert (imported.estimate.time_breakdown_s["tp_comm"]
            != without.estimate.time_breakdown_s["tp_comm"])


def test_tp_comm_overlap_with_megatrons_own_layers_is_refused(tmp_path):
    # Megatron-LM asserts Transformer Engine for --tp-comm-overlap; so does autoplan.
    run = read_run(_megatron_args(tmp_path, "--tp-comm-overlap --transformer-impl local"))
    with pytest.raises(autoplan.AutoplanError, match="transformer_impl"):
        autoplan.estimate(TINY, DGX1, run)


def test_a_plan_priced_with_the_tp_overlap_exports_it_and_reads_back_the_same(tmp_path):
    pins = {"tp": 2, "pp": 1, "mbs": 1, "sp": True}
    planned = autoplan.estimate(TINY, DGX1, pins, seq_len=256, global_batch=16,
                                runtime_settings={"tp_comm_overlap": True})
    assert planned.training.tp_comm_overlap
    export_plan(planned, "megatron", tmp_path)
    assert "--tp-comm-overlap" in (tmp_path / "megatron_args.txt").read_text().split()
    imported = autoplan.estimate(TINY, DGX1, read_run(tmp_path / "megatron_args.txt"))
    assert imported.plan == planned.plan
    assert imported.estimate.step_time_s == planned.estimate.step_time_s


def test_bf16_gradient_reduction_exports_and_reads_back_the_same(tmp_path):
    # Megatron-LM's --grad-reduce-in-bf16 (arguments.py: accumulate_allreduce_grads_in_fp32
    # off under --bf16) is the runtime setting grad_reduce_in_bf16 both ways.
    pins = {"tp": 2, "pp": 1, "mbs": 1, "zero": 1}
    planned = autoplan.estimate(TINY, DGX1, pins, seq_len=256, global_batch=16,
                                runtime_settings={"grad_reduce_in_bf16": True})
    assert planned.training.grad_reduce_in_bf16
    export_plan(planned, "megatron", tmp_path)
    args = (tmp_path / "megatron_args.txt").read_text().split()
    assert "--grad-reduce-in-bf16" in args and "--bf16" in args
    run = read_run(tmp_path / "megatron_args.txt")
    assert run.runtime_settings["grad_reduce_in_bf16"] is True
    imported = autoplan.estimate(TINY, DGX1, run)
    assert imported.plan == planned.plan
    assert imported.estimate.peak_memory_gib == planned.estimate.peak_memory_gib
    plain = autoplan.estimate(TINY, DGX1, pins, seq_len=256, global_batch=16)
    assert "--grad-reduce-in-bf16" not in _exported_args(plain, tmp_path / "plain")
    assert plain.estimate.memory_breakdown_gib["gradients"] > (
        imported.estimate.memory_breakdown_gib["gradients"])


def test_megatron_fsdp_zero2_exports_and_reads_back_the_same(tmp_path):
    # ZeRO-2 on the megatron runtime is Megatron-FSDP's optim_grads both ways; the strategy
    # absent means Megatron-LM's default, optim_grads_params (ZeRO-3); a strategy that is not
    # one of Megatron-LM's choices is refused with the choices.
    pins = {"tp": 2, "pp": 1, "mbs": 1, "zero": 2}
    planned = autoplan.estimate(TINY, DGX1, pins, seq_len=256, global_batch=16,
                                runtime="megatron")
    assert planned.plan.zero_stage == 2
    export_plan(planned, "megatron", tmp_path)
    run = read_run(tmp_path / "megatron_args.txt")
    assert run.pins["zero"] == 2
    imported = autoplan.estimate(TINY, DGX1, run)
    assert imported.plan == planned.plan
    assert imported.estimate.peak_memory_gib == planned.estimate.peak_memory_gib
    args = tmp_path / "fsdp_default.txt"
    args.write_text("--use-megatron-fsdp --tensor-model-parallel-size 2 --micro-batch-size 1 "
                    "--global-batch-size 16 --seq-length 256 --bf16")
    assert read_run(args).pins["zero"] == 3
    args.write_text("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grad "
                    "--tensor-model-parallel-size 2 --micro-batch-size 1")
    with pytest.raises(PlanFileError, match="optim_grads_params"):
        read_run(args)


def _exported_args(result, folder) -> list[str]:
    export_plan(result, "megatron", folder)
    return (folder / "megatron_args.txt").read_text().split()


def test_a_plan_priced_with_an_overlap_config_the_export_cannot_write_is_refused(tmp_path):
    # Without SP there is no overlap to record; with a per-op config the export would launch
    # TE's defaults instead, so it refuses.
    plain = autoplan.estimate(TINY, DGX1, {"tp": 2, "mbs": 1}, seq_len=256, global_batch=16,
                              runtime_settings={"tp_comm_overlap": True})
    assert not plain.training.tp_comm_overlap
    tuned = autoplan.estimate(TINY, DGX1, {"tp": 2, "mbs": 1, "sp": True}, seq_len=256,
                              global_batch=16, runtime_settings={
                                  "tp_comm_overlap": True,
                                  "tp_comm_overlap_cfg": {"proj_fprop": {"num_sm": 24}}})
    assert tuned.training.tp_comm_overlap_cfg["proj_fprop"]["num_sm"] == 24
    with pytest.raises(autoplan.AutoplanError, match="tp_comm_overlap_cfg"):
        export_plan(tuned, "megatron", tmp_path)


def test_solve_from_searches_with_the_framework_flags_the_file_sets(tmp_path):
    # The optimum is priced, and recorded for the export, with the overlap the current setup
    # runs: the JSON's plan costs what estimate() says of it under the same runtime setting.
    run = _megatron_args(tmp_path, "--tp-comm-overlap")
    result = CliRunner().invoke(app, ["solve", TINY, DGX1, "--from", str(run), "--tp", "2",
                                      "--sp", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["training"]["tp_comm_overlap"] is True
    plan = autoplan.Plan.model_validate(document["plan"])
    overlapped = autoplan.estimate(TINY, DGX1, plan, seq_len=256, global_batch=16,
                                   runtime="megatron", runtime_settings={"tp_comm_overlap": True})
    assert document["estimate"]["step_time_s"] == overlapped.estimate.step_time_s
    assert document["estimate"]["peak_memory_gib"] == overlapped.estimate.peak_memory_gib
    plain = autoplan.estimate(TINY, DGX1, plan, seq_len=256, global_batch=16, runtime="megatron")
    assert plain.estimate.peak_memory_gib < overlapped.estimate.peak_memory_gib  # userbuffers


def test_runtime_settings_need_one_runtime_named():
    with pytest.raises(autoplan.AutoplanError, match="one runtime's: name it"):
        autoplan.solve(TINY, DGX1, seq_len=256, global_batch=16,
                       runtime_settings={"tp_comm_overlap": True})
