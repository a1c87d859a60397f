"""torchtitan overrides, parsed by tyro into torchtitan's own config dataclasses.

torchtitan's ConfigManager needs a model's config registry, which imports triton; the sections
we override are parsed here the same way (tyro, torchtitan's registry rules), and ParallelDims
checks the degrees against the world size.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.errors import ExportError
from autoplan.plugins.torchtitan import torchtitan_overrides
from tests.extras import require
from tests.plugins.plans import changed, load_plan

tyro = require("tyro")
configs = require("torchtitan.config.configs")
manager = require("torchtitan.config.manager")
ac = require("torchtitan.distributed.activation_checkpoint")
parallel_dims = require("torchtitan.distributed.parallel_dims")

TORCHTITAN_PLANS = ["llama8b_3d_vpp_sp", "llama8b_zero3_offload_1gpu", "gpt13b_ethernet_10g"]


@dataclasses.dataclass
class OverriddenSections:
    """The Trainer.Config fields our overrides touch, with torchtitan's types and defaults."""

    training: configs.TrainingConfig = dataclasses.field(default_factory=configs.TrainingConfig)
    parallelism: configs.ParallelismConfig = dataclasses.field(
        default_factory=configs.ParallelismConfig)
    activation_checkpoint: ac.ActivationCheckpointingConfig = dataclasses.field(
        default_factory=ac.SelectiveAC.Config)
    compile: configs.CompileConfig = dataclasses.field(default_factory=configs.CompileConfig)


def parse(overrides: list[str]) -> OverriddenSections:
    manager.ConfigManager.register_tyro_rules(manager.custom_registry)
    return tyro.cli(OverriddenSections, args=overrides, registry=manager.custom_registry)


@pytest.mark.parametrize("name", TORCHTITAN_PLANS)
def test_overrides_parse_and_parallel_dims_accept_them(name):
    result = load_plan(name)
    config = parse(torchtitan_overrides(result))
    dims = parallel_dims.ParallelDims.from_config(config.parallelism, result.plan.world_size)
    plan = result.plan
    assert (dims.tp, dims.pp, dims.cp, dims.dp_replicate * dims.dp_shard) == (
        plan.tp, plan.pp, plan.cp, plan.dp)
    assert config.parallelism.enable_sequence_parallel == plan.sequence_parallel


def test_activation_checkpoint_mode_follows_recompute():
    expected = {"llama8b_3d_vpp_sp": ac.SelectiveAC.Config,
                "llama8b_zero3_offload_1gpu": ac.FullAC.Config}
    for name, kind in expected.items():
        assert type(parse(torchtitan_overrides(load_plan(name))).activation_checkpoint) is kind
    result = changed(load_plan("gpt13b_ethernet_10g"), plan={"recompute": "none"})
    assert parse(torchtitan_overrides(result)).activation_checkpoint is None


def test_pipeline_batch_is_split_into_planned_micro_batches():
    result = load_plan("llama8b_3d_vpp_sp")
    config = parse(torchtitan_overrides(result))
    plan = result.plan
    assert config.training.local_batch_size == plan.micro_batch_size * plan.num_microbatches
    assert config.parallelism.pipeline_parallel_microbatch_size == plan.micro_batch_size
    assert config.training.global_batch_size == plan.global_batch_size
    assert config.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"


def test_without_pipeline_accumulation_comes_from_the_global_batch():
    result = load_plan("llama8b_zero3_offload_1gpu")
    config = parse(torchtitan_overrides(result))
    assert config.training.local_batch_size == result.plan.micro_batch_size
    assert config.training.global_batch_size == result.plan.global_batch_size
    assert config.training.enable_cpu_offload


def test_model_parts_name_every_layer_once_in_stage_order():
    result = load_plan("llama8b_3d_vpp_sp")
    parts = parse(torchtitan_overrides(result)).parallelism.module_fqns_per_model_part
    assert len(parts) == result.plan.pp * result.plan.vpp
    flat = [name for part in parts for name in part]
    assert flat == ["tok_embeddings", *[f"layers.{i}" for i in range(32)], "norm", "lm_head"]


def test_fp16_is_refused():
    result = changed(load_plan("gpt13b_ethernet_10g"),
                     training={"seq_len": 2048, "global_batch": 128, "precision": "fp16",
                               "runtime": "fsdp"})
    with pytest.raises(ExportError, match="bf16 only"):
        torchtitan_overrides(result)


def test_context_parallel_degree_is_exported():
    result = changed(load_plan("llama8b_3d_vpp_sp"),
                     plan={"cp": 2, "dp": 1, "num_microbatches": 64})
    config = parse(torchtitan_overrides(result))
    dims = parallel_dims.ParallelDims.from_config(config.parallelism, result.plan.world_size)
    assert dims.cp == config.parallelism.context_parallel_degree == 2


def test_zero_bubble_schedule_is_one_torch_pipelining_knows():
    schedules = require("torch.distributed.pipelining.schedules")
    result = changed(load_plan("llama8b_3d_vpp_sp"), plan={"pipeline_schedule": "zero_bubble"})
    config = parse(torchtitan_overrides(result))
    name = config.parallelism.pipeline_parallel_schedule
    assert schedules.get_schedule_class(name) is schedules.ScheduleInterleavedZeroBubble


def test_expert_parallel_degree_is_exported_where_torchtitan_borrows_it_from_fsdp():
    # gpt13b_ethernet_10g: tp=1, dp=8; with ZeRO-2 torchtitan shards over the 8 DP ranks, and
    # its EP borrows 2 of them: the experts' FSDP group is efsdp = dp_shard*cp*tp/ep = 4, the
    # plan's expert-data-parallel group dp*cp/ep.
    result = changed(load_plan("gpt13b_ethernet_10g"),
                     plan={"ep": 2, "zero_stage": 2, "pp": 1, "world_size": 8,
                           "num_microbatches": 16, "stages": [{"first_layer": 0, "num_layers": 34}]})
    config = parse(torchtitan_overrides(result))
    dims = parallel_dims.ParallelDims.from_config(config.parallelism, result.plan.world_size)
    assert dims.ep == config.parallelism.expert_parallel_degree == 2
    assert dims.dp_shard * dims.cp * dims.tp // dims.ep == result.plan.dp * result.plan.cp // 2


@pytest.mark.parametrize("plan, reason", [
    ({"ep": 2, "zero_stage": 0}, "ZeRO-0"),
    ({"ep": 2, "tp": 2, "dp": 4, "num_microbatches": 32}, "not split by TP"),
])
def test_expert_parallelism_torchtitan_cannot_match_is_refused(plan, reason):
    result = changed(load_plan("gpt13b_ethernet_10g"), plan=plan)
    with pytest.raises(ExportError, match=reason):
        torchtitan_overrides(result)


def test_compile_is_turned_on_only_for_plans_priced_with_it():
    """A plan priced with the fsdp runtime's ``compile`` launches torchtitan's torch.compile of
    the model (not the loss, which the runtime prices eager); an eager plan leaves
    CompileConfig at torchtitan's default (off)."""
    result = load_plan("llama8b_zero3_offload_1gpu")
    assert parse(torchtitan_overrides(result)).compile.enable is False
    training = {**result.training.model_dump(mode="json"), "torch_compile": True}
    compiled = parse(torchtitan_overrides(changed(result, training=training))).compile
    assert compiled.enable is True
    assert compiled.components == ["model"]


def test_a_compiled_estimate_records_it_and_an_eager_one_keeps_the_json_unchanged():
    """The setting travels from ``runtime_settings`` to the result the exporter reads; eager
    results keep their JSON without the key (determinism of existing files)."""
    import types
    from pathlib import Path

    import autoplan
    from autoplan.zoo import Llama, LlamaConfig, next_token_loss

    model = types.ModuleType("tiny_llama")
    model.build_model = lambda: Llama(LlamaConfig(num_layers=2, hidden_size=128, num_heads=2,
                                                  num_kv_heads=2, ffn_hidden_size=256,
                                                  vocab_size=256))
    model.loss = next_token_loss
    cluster = Path(__file__).parents[2] / "examples" / "clusters" / "dgx-h100-x4.yaml"

    def estimate(**settings):
        return autoplan.estimate(model, cluster, {"dp": 32, "mbs": 1}, seq_len=512,
                                 global_batch=32, runtime="fsdp", runtime_settings=settings)

    assert estimate(compile=True).training.torch_compile is True
    assert "torch_compile" not in estimate().model_dump(mode="json")["training"]
