"""accelerate config files, loaded by accelerate's own loader and launch-argument validation."""

from __future__ import annotations

import pytest

from autoplan.errors import ExportError
from autoplan.plugins import export_plan
from autoplan.plugins.accelerate import accelerate_config
from tests.extras import require
from tests.plugins.plans import changed, load_plan

config_args = require("accelerate.commands.config.config_args")
launch = require("accelerate.commands.launch")

ACCELERATE_PLANS = {"llama8b_zero3_offload_1gpu": "DEEPSPEED",
                    "gpt13b_ethernet_10g": "MEGATRON_LM"}
SECTIONS = ("megatron_lm_config", "deepspeed_config", "fsdp_config", "parallelism_config")


def launch_args(config_file):
    """What ``accelerate launch --config_file FILE train.py`` makes of the file."""
    args = launch.launch_command_parser().parse_args(["--config_file", str(config_file),
                                                      "train.py"])
    return launch._validate_launch_command(args)[0]


@pytest.mark.parametrize("name", ACCELERATE_PLANS)
def test_accelerate_loads_the_file_and_launch_reads_every_key(name, tmp_path):
    result = load_plan(name)
    export_plan(result, "accelerate", tmp_path)
    path = tmp_path / "accelerate_config.yaml"
    loaded = config_args.load_config_from_file(str(path))
    assert loaded.distributed_type.value == ACCELERATE_PLANS[name]
    assert loaded.num_processes == result.plan.world_size
    dests = {action.dest for action in launch.launch_command_parser()._actions}
    config = accelerate_config(result)
    nested = {key for section in SECTIONS for key in config.get(section, {})}
    assert nested <= dests, nested - dests
    args = launch_args(path)
    for section in SECTIONS:
        for key, value in config.get(section, {}).items():
            assert getattr(args, key) == value, key


def test_megatron_backend_writes_context_parallel_and_recompute_explicitly():
    section = accelerate_config(load_plan("gpt13b_ethernet_10g"))["megatron_lm_config"]
    assert section["megatron_lm_context_parallel_size"] == 1
    assert section["megatron_lm_recompute_granularity"] == "full"


def test_megatron_backend_refuses_selective_recompute_it_cannot_express():
    result = changed(load_plan("gpt13b_ethernet_10g"), plan={"recompute": "selective"})
    with pytest.raises(ExportError, match="only full recompute"):
        accelerate_config(result)


def test_fsdp2_backend_for_a_sharded_plan():
    result = changed(load_plan("llama8b_zero3_offload_1gpu"),
                     training={"seq_len": 4096, "global_batch": 16, "precision": "bf16",
                               "runtime": "fsdp"})
    config = accelerate_config(result)
    assert config["distributed_type"] == "FSDP"
    assert config["fsdp_config"]["fsdp_version"] == 2
    assert config["fsdp_config"]["fsdp_reshard_after_forward"] is True
    assert config["fsdp_config"]["fsdp_offload_params"] is True
