"""Each export is priced for the runtime it targets; --export all says which targets cannot run
the plan; DeepSpeed pipelines are exported as Megatron-DeepSpeed arguments plus ds_config."""

import json
import re

import autoplan
from autoplan.plugins import priced_for, refused_targets, render_all
from autoplan.plugins.deepspeed import megatron_deepspeed_args
from tests.search.test_solver import cluster, tiny_gpt

QUESTION = dict(seq_len=256, global_batch=16, runners_up=False)


def _predicted(text: str) -> tuple[str, float]:
    """(runtime name, step seconds) of an exported file's 'Predicted for X: N s/step' line."""
    match = re.search(r"Predicted for ([\w/-]+): ([\d.]+) s/step", text)
    return match.group(1), float(match.group(2))


def test_export_all_stamps_each_target_with_its_own_runtimes_step_time():
    model, spec = tiny_gpt(4, 128, 8), cluster(1, 4, False)
    # ZeRO-0 data parallelism: a plan every runtime runs (FSDP has no ZeRO-1).
    result = autoplan.solve(model, spec, runtime="megatron", pins={"tp": 1, "pp": 1, "zero": 0},
                            **QUESTION)
    files = render_all(result, "all")
    for target, name, runtime in (("megatron_args.txt", "Megatron-LM", "megatron"),
                                  ("hostfile", "DeepSpeed", "deepspeed"),
                                  ("torchtitan_args.txt", "FSDP", "fsdp")):
        # The independent price: estimate() of the same plan on that runtime.
        expected = autoplan.estimate(model, spec, result.plan, seq_len=256, global_batch=16,
                                     runtime=runtime).estimate.step_time_s
        stamped_runtime, stamped = _predicted(files[target])
        assert stamped_runtime == name
        assert stamped == float(f"{expected:.3f}")
    deepspeed_s = result.estimates_by_runtime["deepspeed"].step_time_s
    assert deepspeed_s != result.estimate.step_time_s  # the runtimes do price it differently


def test_export_all_lists_the_targets_that_cannot_run_the_plan():
    model, spec = tiny_gpt(8, 128, 8), cluster(1, 8, False)
    result = autoplan.solve(model, spec, runtime="megatron", pins={"pp": 4, "vpp": 2, "dp": 2},
                            **QUESTION)
    refused = dict(line.split(": ", 1) for line in refused_targets(result))
    assert "interleaved" in refused["deepspeed"]
    assert "megatron" not in refused and "torchtitan" not in refused


def test_a_deepspeed_pipeline_is_megatron_deepspeed_arguments_and_a_matching_ds_config():
    model, spec = tiny_gpt(4, 128, 8), cluster(1, 8, False)
    result = autoplan.solve(model, spec, runtime="deepspeed", pins={"tp": 2, "pp": 2},
                            **QUESTION)
    files = render_all(result, "deepspeed")
    config = json.loads(files["ds_config.json"])
    args = megatron_deepspeed_args(result)
    value = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert value["--tensor-model-parallel-size"] == "2"
    assert value["--pipeline-model-parallel-size"] == "2"
    assert int(value["--zero-stage"]) == config["zero_optimization"]["stage"] <= 1
    assert int(value["--micro-batch-size"]) == config["train_micro_batch_size_per_gpu"]
    assert "tensor_parallel" not in config  # Megatron TP, not AutoTP, inside the pipeline
    assert "megatron_deepspeed_args.txt" in files
    assert '"${ARGS[@]}"' in files["launch_deepspeed.sh"]


def test_a_plan_not_priced_elsewhere_keeps_its_own_runtime_in_the_header():
    model, spec = tiny_gpt(4, 128, 8), cluster(1, 4, False)
    result = autoplan.solve(model, spec, runtime="megatron", pins={"tp": 1, "pp": 1, "zero": 1},
                            **QUESTION).model_copy(update={"estimates_by_runtime": None})
    assert priced_for(result, "deepspeed") is result
