"""DeepSpeed files, checked by DeepSpeed's own config class and hostfile parser."""

from __future__ import annotations

import json
import re
from unittest import mock

import pytest

from autoplan.errors import ExportError
from autoplan.plugins.deepspeed import deepspeed_config, render
from tests.extras import require
from tests.plugins.plans import changed, load_plan

dist = require("deepspeed.comm")
ds_config = require("deepspeed.runtime.config")
runner = require("deepspeed.launcher.runner")

DEEPSPEED_PLANS = ["llama8b_zero3_offload_1gpu", "gpt13b_ethernet_10g"]

# DeepSpeed ignores unknown top-level keys, so a misspelt one would be silently dropped: ours must
# all be names DeepSpeedConfig reads (deepspeed/runtime/config.py and its constants).
KNOWN_TOP_LEVEL = {"train_batch_size", "train_micro_batch_size_per_gpu",
                   "gradient_accumulation_steps", "zero_optimization", "bf16", "fp16",
                   "activation_checkpointing", "pipeline", "tensor_parallel",
                   "zero_allow_untested_optimizer"}


def parse_with_deepspeed(config: dict, *, dp: int):
    """DeepSpeedConfig as a rank of a job with ``dp`` data-parallel ranks would build it."""
    with mock.patch.object(dist, "get_rank", return_value=0), \
            mock.patch.object(dist, "get_world_size", return_value=dp):
        return ds_config.DeepSpeedConfig(config)


@pytest.mark.parametrize("name", DEEPSPEED_PLANS)
def test_deepspeed_accepts_the_config_and_reads_our_values(name):
    result = load_plan(name)
    config = json.loads(render(result)["ds_config.json"])
    parsed = parse_with_deepspeed(config, dp=result.plan.dp)
    assert parsed.train_batch_size == result.plan.global_batch_size
    assert parsed.gradient_accumulation_steps == result.plan.num_microbatches
    assert parsed.zero_optimization_stage == result.plan.zero_stage
    assert set(config) <= KNOWN_TOP_LEVEL
    assert "auto" not in json.dumps(config)


@pytest.mark.parametrize("name", DEEPSPEED_PLANS)
def test_train_batch_size_is_micro_batch_times_accumulation_times_dp(name):
    result = load_plan(name)
    config = deepspeed_config(result)
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * result.plan.dp)


def test_deepspeed_itself_rejects_a_wrong_batch_rule():
    """The patched world size really reaches DeepSpeed's batch check."""
    result = load_plan("gpt13b_ethernet_10g")
    config = dict(deepspeed_config(result), train_batch_size=100)
    with pytest.raises(AssertionError, match="train_batch_size"):
        parse_with_deepspeed(config, dp=result.plan.dp)


def test_offload_blocks_for_zero3_parameter_offload():
    zero = deepspeed_config(load_plan("llama8b_zero3_offload_1gpu"))["zero_optimization"]
    assert zero == {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                    "offload_param": {"device": "cpu", "pin_memory": True}}


def test_pipeline_with_zero2_is_refused():
    result = changed(load_plan("gpt13b_ethernet_10g"), plan={"zero_stage": 2})
    with pytest.raises(ExportError, match="ZeRO-2"):
        deepspeed_config(result)


def test_hostfile_parses_with_deepspeeds_parser_and_lists_ips():
    text = render(load_plan("gpt13b_ethernet_10g"))["hostfile"]
    pool = runner._parse_hostfile(text.splitlines())
    assert pool == {"192.168.1.11": 8, "192.168.1.12": 8}


@pytest.mark.parametrize("name", DEEPSPEED_PLANS)
def test_deepspeed_env_is_strictly_key_value_lines(name):
    text = render(load_plan(name))[".deepspeed_env"]
    assert not text or text.endswith("\n")
    for line in text.split("\n")[:-1]:
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S+", line), repr(line)
        key, value = line.split("=", maxsplit=1)  # what DeepSpeed's launcher does


def test_ethernet_cluster_disables_infiniband_and_names_the_interface():
    text = render(load_plan("gpt13b_ethernet_10g"))[".deepspeed_env"]
    assert text == "NCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME=eth0\n"


def test_multi_node_without_hosts_is_refused():
    result = load_plan("gpt13b_ethernet_10g")
    cluster = {k: v for k, v in result.cluster.items() if k != "hosts"}
    with pytest.raises(ExportError, match="IP address"):
        render(changed(result, cluster=cluster))


def test_roce_keeps_nccl_on_rdma():
    result = load_plan("gpt13b_ethernet_10g")
    inter = {"link": "roce", "bandwidth": "200Gbps", "interface": "ens1"}
    text = render(changed(result, cluster=dict(result.cluster, inter_node=inter)))[".deepspeed_env"]
    assert text == "NCCL_SOCKET_IFNAME=ens1\n"


def test_tensor_parallel_plan_uses_autotp_and_deepspeed_accepts_it():
    result = changed(load_plan("gpt13b_ethernet_10g"),
                     plan={"tp": 2, "pp": 1, "zero_stage": 2, "stages": [
                         {"first_layer": 0, "num_layers": 34}]})
    config = deepspeed_config(result)
    assert config["tensor_parallel"] == {"autotp_size": 2}
    parsed = parse_with_deepspeed(config, dp=result.plan.dp)
    assert parsed.tensor_parallel_config.autotp_size == 2


def test_an_interface_that_is_not_a_name_is_refused():
    result = load_plan("gpt13b_ethernet_10g")
    inter = dict(result.cluster["inter_node"], interface="eth0 ; reboot")
    with pytest.raises(ExportError, match="not an interface name"):
        render(changed(result, cluster=dict(result.cluster, inter_node=inter)))


def test_a_lora_fine_tune_with_8bit_adam_under_zero_lets_deepspeed_take_the_client_optimizer():
    result = load_plan("gpt13b_ethernet_10g")  # ZeRO-1
    doc = result.model_dump(mode="json")
    lora = changed(result, training={**doc["training"], "optimizer": "adamw8bit", "frozen_dtype": "nf4"},
                   model={**doc["model"], "num_trainable_params": doc["model"]["num_params"] // 100})
    files = render(lora)
    config = json.loads(files["ds_config.json"])
    assert set(config) <= KNOWN_TOP_LEVEL
    # DeepSpeed's engine asserts on optimizers outside ZERO_SUPPORTED_OPTIMIZERS unless this is set.
    assert parse_with_deepspeed(config, dp=lora.plan.dp).zero_allow_untested_optimizer is True
    assert "bitsandbytes.optim.AdamW8bit" in files["launch_deepspeed.sh"]
    assert "p.requires_grad" in files["launch_deepspeed.sh"] and "stored in nf4" in files["launch_deepspeed.sh"]
