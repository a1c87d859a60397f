"""Megatron exports carry the architecture the trace knows (issue 14 item 18): rotary base and
scaling, norm epsilon, untied embeddings, the MoE dispatcher; launch scripts set the NCCL
interface. Flag names and types are those of Megatron-LM's megatron/training/arguments.py
(--rotary-base int, --norm-epsilon float, --use-rope-scaling, --rope-scaling-factor float)."""

from __future__ import annotations

import types


from autoplan import api
from autoplan.plugins.megatron import megatron_args, render
from autoplan.plugins.torchtitan import exporter as torchtitan
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.plugins.test_megatron import transformer_config

ONE_NODE = {"gpu": "h100-sxm5-80gb", "nodes": 1, "gpus_per_node": 8,
            "intra_node": {"link": "nvswitch", "bandwidth": "450GB/s"}}
TWO_ETHERNET_NODES = {"gpu": "h100-sxm5-80gb", "nodes": 2, "gpus_per_node": 8,
                      "intra_node": {"link": "nvswitch", "bandwidth": "450GB/s"},
                      "inter_node": {"link": "ethernet", "bandwidth": "100Gbps",
                                     "interface": "eth0"},
                      "hosts": [{"name": "a", "ip": "10.0.0.1"}, {"name": "b", "ip": "10.0.0.2"}]}


def _module(build, name):
    module = types.ModuleType(name)
    module.build_model = build
    module.loss = next_token_loss
    return module


def _args(module, cluster=ONE_NODE):
    result = api.estimate(module, cluster, {"tp": 2}, seq_len=128, global_batch=8)
    return result, megatron_args(result)


def _value(args, flag):
    return args[args.index(flag) + 1]


def test_a_zoo_llama_keeps_its_rotary_base_and_norm_epsilon():
    """LlamaConfig(rope_theta=500000) with the zoo's RMSNorm (eps 1e-5): Megatron's defaults
    are base 10000 and eps 1e-5, so the base must be written."""
    config = LlamaConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                         ffn_hidden_size=128, vocab_size=256, rope_theta=500000.0)
    result, args = _args(_module(lambda: Llama(config), "llama_500k"))
    assert result.model.rope_theta == 500000.0
    assert _value(args, "--rotary-base") == "500000"
    assert float(_value(args, "--norm-epsilon")) == 1e-5
    assert "--untie-embeddings-and-output-weights" in args
    assert "--use-rope-scaling" not in args
    assert transformer_config(args).layernorm_epsilon == 1e-5


def test_a_hugging_face_llama_3_1_keeps_base_scaling_and_epsilon():
    import transformers
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=256, max_position_embeddings=8192, rope_theta=500000.0,
        rms_norm_eps=1e-6, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192})
    module = _module(lambda: transformers.LlamaForCausalLM(config), "hf_llama31")
    module.loss = lambda output, inputs: output.logits.float().mean()
    _, args = _args(module)
    assert _value(args, "--rotary-base") == "500000"
    assert float(_value(args, "--norm-epsilon")) == 1e-6
    assert "--use-rope-scaling" in args and float(_value(args, "--rope-scaling-factor")) == 8.0


def test_moe_exports_use_the_all_to_all_dispatcher_and_grouped_gemm():
    from tests.search.moe_models import tiny_moe
    result = api.estimate(tiny_moe(2, 64, 4), ONE_NODE, {"ep": 4, "dp": 8}, seq_len=128,
                          global_batch=8)
    args = megatron_args(result)
    assert _value(args, "--moe-token-dispatcher-type") == "alltoall"
    assert "--moe-grouped-gemm" in args
    config = transformer_config(args)  # megatron-core's own checks accept them
    assert config.moe_token_dispatcher_type == "alltoall" and config.moe_grouped_gemm


def test_megatron_and_torchtitan_scripts_name_the_nccl_interface():
    config = LlamaConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                         ffn_hidden_size=128, vocab_size=256)
    result, _ = _args(_module(lambda: Llama(config), "llama_eth"), TWO_ETHERNET_NODES)
    for script in (render(result)["launch_megatron.sh"],
                   torchtitan.render(result)["launch_torchtitan.sh"]):
        assert "export NCCL_SOCKET_IFNAME=eth0" in script
        assert "export NCCL_IB_DISABLE=1" in script
