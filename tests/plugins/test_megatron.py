"""Megatron-LM arguments, checked by megatron-core's own TransformerConfig and partition code."""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import ExportError
from autoplan.plugins.importers import read_run
from autoplan.plugins.megatron import megatron_args, render
from tests.extras import require
from tests.plugins.plans import changed, load_plan, stages_for

core = require("megatron.core.transformer.transformer_config")
block = require("megatron.core.transformer.transformer_block")
layout_mod = require("megatron.core.transformer.pipeline_parallel_layer_layout")
from megatron.core.transformer.enums import LayerType  # noqa: E402

MEGATRON_PLANS = ["llama8b_3d_vpp_sp", "gpt13b_uneven_stages", "gpt13b_ethernet_10g"]

# pretrain_gpt.py flag -> TransformerConfig field (Megatron-LM's core_transformer_config_from_args
# copies same-named args; these are the ones whose names differ or that take a value).
_VALUED = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size",
    "--num-attention-heads": "num_attention_heads", "--ffn-hidden-size": "ffn_hidden_size",
    "--num-query-groups": "num_query_groups", "--tensor-model-parallel-size":
    "tensor_model_parallel_size", "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size",
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers", "--normalization": "normalization",
    "--expert-model-parallel-size": "expert_model_parallel_size",
    "--num-experts": "num_moe_experts", "--moe-router-topk": "moe_router_topk",
    "--norm-epsilon": "layernorm_epsilon", "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
    "--transformer-impl": "transformer_impl",
    "--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe",
    "--fp8-amax-history-len": "fp8_amax_history_len",
    "--fp8-amax-compute-algo": "fp8_amax_compute_algo",
}
_SWITCHES = {"--sequence-parallel": ("sequence_parallel", True), "--swiglu": ("gated_linear_unit", True),
             "--disable-bias-linear": ("add_bias_linear", False), "--bf16": ("bf16", True),
             "--fp16": ("fp16", True), "--moe-grouped-gemm": ("moe_grouped_gemm", True),
             "--tp-comm-overlap": ("tp_comm_overlap", True)}
# Flags that configure the training loop, not the TransformerConfig.
_ELSEWHERE = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings",
              "--use-distributed-optimizer", "--group-query-attention", "--position-embedding-type",
              "--untie-embeddings-and-output-weights", "--optimizer-cpu-offload",
              "--optimizer-offload-fraction", "--use-precision-aware-optimizer",
              "--overlap-cpu-optimizer-d2h-h2d", "--use-megatron-fsdp",
              "--data-parallel-sharding-strategy", "--ckpt-format",
              "--no-gradient-accumulation-fusion",
              "--use-tp-pp-dp-mapping",  # parallel_state's rank order, not the TransformerConfig
              "--overlap-grad-reduce", "--overlap-param-gather",  # DistributedDataParallelConfig
              "--fp8-param-gather",  # DistributedDataParallelConfig / TE's fp8_model_init
              "--grad-reduce-in-bf16",  # DistributedDataParallelConfig.grad_reduce_in_fp32 off
              "--rotary-base", "--use-rope-scaling", "--rope-scaling-factor"}  # GPTModel's


def _number_or_text(value: str):
    try:
        return float(value)
    except ValueError:
        return value


def transformer_config(args: list[str]):
    """Build megatron-core's TransformerConfig from our flags (its __post_init__ runs the
    TP-vs-heads, SP-needs-TP, uneven-stage and recompute checks)."""
    kwargs, index = {}, 0
    while index < len(args):
        flag = args[index]
        if flag in _VALUED:
            value = args[index + 1]
            kwargs[_VALUED[flag]] = int(value) if value.isdigit() else _number_or_text(value)
            index += 2
        elif flag in _SWITCHES:
            name, value = _SWITCHES[flag]
            kwargs[name] = value
            index += 1
        else:
            assert flag in _ELSEWHERE, f"unmapped flag {flag}"
            index += 1 if index + 1 == len(args) or args[index + 1].startswith("--") else 2
    # Megatron-LM derives both dtypes from --bf16/--fp16 (arguments.py: params_dtype).
    dtype = torch.bfloat16 if kwargs.get("bf16") else torch.float16
    kwargs.update(params_dtype=dtype, pipeline_dtype=dtype)
    if kwargs.get("virtual_pipeline_model_parallel_size") == 1:
        kwargs.pop("virtual_pipeline_model_parallel_size")
    return core.TransformerConfig(**kwargs)


def built_partition(config) -> list[int]:
    """Transformer blocks per stage (pipeline order) as megatron-core builds them."""
    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size or 1
    if config.pipeline_model_parallel_layout is not None:
        grid = config.pipeline_model_parallel_layout.layout
        return [grid[s % pp][s // pp].count(LayerType.decoder) for s in range(pp * vpp)]
    return [block.get_num_layers_to_build(config, vp_stage=s // pp if vpp > 1 else None,
                                          pp_rank=s % pp) for s in range(pp * vpp)]


def planned_blocks(result) -> list[int]:
    kinds = result.model.layer_kinds
    return [kinds[s.first_layer:s.first_layer + s.num_layers].count("block")
            for s in result.plan.stages]


@pytest.mark.parametrize("name", MEGATRON_PLANS)
def test_transformer_config_accepts_and_builds_the_planned_stages(name):
    result = load_plan(name)
    config = transformer_config(megatron_args(result))
    assert built_partition(config) == planned_blocks(result)


def test_partial_recompute_is_megatrons_block_method():
    result = changed(load_plan("llama8b_3d_vpp_sp"),
                     plan={"recompute": "full", "recompute_num_layers": 2})
    args = megatron_args(result)
    assert " ".join(args).count("--recompute-method block --recompute-num-layers 2") == 1
    config = transformer_config(args)  # megatron-core's checks of granularity/method/num_layers
    assert (config.recompute_method, config.recompute_num_layers) == ("block", 2)


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan", "colossalai"])
def test_partial_recompute_is_refused_where_it_cannot_be_said(target, tmp_path):
    from autoplan.plugins import export_plan
    result = changed(load_plan("llama8b_3d_vpp_sp"),
                     plan={"recompute": "full", "recompute_num_layers": 2})
    with pytest.raises(ExportError, match="recompute_num_layers"):
        export_plan(result, target, tmp_path)


def test_even_interleaved_plan_uses_virtual_stages_flag():
    args = megatron_args(load_plan("llama8b_3d_vpp_sp"))
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
    assert "--virtual-pipeline-model-parallel-size" not in args
    assert "--pipeline-model-parallel-layout" not in args


def test_uneven_ends_use_first_and_last_stage_flags():
    args = megatron_args(load_plan("gpt13b_uneven_stages"))
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "7"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "7"


def test_general_partition_uses_a_layout_megatron_parses():
    result = changed(load_plan("gpt13b_uneven_stages"), plan={"stages": stages_for([6, 8, 9, 7])})
    args = megatron_args(result)
    layout = args[args.index("--pipeline-model-parallel-layout") + 1]
    parsed = layout_mod.PipelineParallelLayerLayout(layout, 4)
    parsed.validate_layer_layout(num_layers=30, mtp_num_layers=None)
    assert built_partition(transformer_config(args)) == [6, 8, 9, 7]


def test_model_shape_flags_for_a_llama_like_model():
    args = megatron_args(load_plan("llama8b_3d_vpp_sp"))
    for flag in ("--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                 "--group-query-attention", "--sequence-parallel", "--bf16"):
        assert flag in args
    assert args[args.index("--num-query-groups") + 1] == "8"
    assert args[args.index("--normalization") + 1] == "RMSNorm"
    assert args[args.index("--position-embedding-type") + 1] == "rope"


def test_interleaving_needs_micro_batches_in_multiples_of_pp():
    result = changed(load_plan("llama8b_3d_vpp_sp"),
                     plan={"num_microbatches": 6, "micro_batch_size": 1, "global_batch_size": 12})
    with pytest.raises(ExportError, match="multiple of pp=4"):
        megatron_args(result)


def test_sequence_parallel_without_tp_is_refused_like_megatron_core_does():
    result = changed(load_plan("gpt13b_ethernet_10g"), plan={"sequence_parallel": True})
    with pytest.raises(ExportError, match="sequence parallelism needs tp > 1"):
        megatron_args(result)
    args = megatron_args(load_plan("gpt13b_ethernet_10g")) + ["--sequence-parallel"]
    with pytest.raises(ValueError):
        transformer_config(args)


def test_heads_not_divisible_by_tp_is_refused():
    result = changed(load_plan("gpt13b_uneven_stages"), plan={"tp": 3, "world_size": 12})
    with pytest.raises(ExportError, match="40 attention heads"):
        megatron_args(result)


def test_parameter_offload_is_refused():
    with pytest.raises(ExportError, match="offload parameters"):
        megatron_args(load_plan("llama8b_zero3_offload_1gpu"))


def test_single_cuda_connection_exported_only_with_tp_or_cp():
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in render(load_plan("llama8b_3d_vpp_sp"))[
        "launch_megatron.sh"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render(load_plan("gpt13b_ethernet_10g"))[
        "launch_megatron.sh"]


def test_zero3_is_megatron_fsdp_without_single_cuda_connection():
    result = changed(load_plan("llama8b_3d_vpp_sp"), plan={"zero_stage": 3})
    args = megatron_args(result)
    assert args[args.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    assert "--use-megatron-fsdp" in args
    transformer_config(args)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render(result)["launch_megatron.sh"]


def test_zero2_is_megatron_fsdp_sharding_optimizer_and_gradients():
    # megatron-core's own config takes the strategy, and Megatron-FSDP (not the distributed
    # optimizer's DDP, which asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP) runs it.
    from megatron.core.distributed import DistributedDataParallelConfig

    result = changed(load_plan("llama8b_3d_vpp_sp"), plan={"zero_stage": 2})
    args = megatron_args(result)
    strategy = args[args.index("--data-parallel-sharding-strategy") + 1]
    assert strategy == "optim_grads"
    assert {"--use-megatron-fsdp", "--use-distributed-optimizer", "--overlap-grad-reduce",
            "--overlap-param-gather"} <= set(args)
    config = DistributedDataParallelConfig(use_megatron_fsdp=True, use_distributed_optimizer=True,
                                           data_parallel_sharding_strategy=strategy)
    assert config.data_parallel_sharding_strategy == "optim_grads"
    transformer_config(args)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render(result)["launch_megatron.sh"]


def test_context_parallelism_is_exported():
    result = changed(load_plan("llama8b_3d_vpp_sp"),
                     plan={"cp": 2, "dp": 1, "num_microbatches": 64})
    args = megatron_args(result)
    assert args[args.index("--context-parallel-size") + 1] == "2"
    assert transformer_config(args).context_parallel_size == 2


def test_uneven_interleaving_is_a_layout_megatron_builds():
    """10 blocks cannot be split evenly over 4 ranks x 2 chunks: the solver may still
    interleave (first and last chunks lighter) and Megatron builds exactly that layout."""
    import types

    import autoplan
    from autoplan.zoo import GPT, GPTConfig, next_token_loss

    module = types.ModuleType("gpt10")
    module.build_model = lambda: GPT(GPTConfig(num_layers=10, hidden_size=64, num_heads=4,
                                               vocab_size=256, max_seq_len=128))
    module.loss = next_token_loss
    cluster = {"gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 8,
               "intra_node": {"link": "nvswitch"}}
    result = autoplan.solve(module, cluster, seq_len=128, global_batch=8,
                            pins={"tp": 1, "pp": 4, "vpp": 2, "dp": 2, "mbs": 1})
    blocks = planned_blocks(result)
    assert len(blocks) == 8 and sum(blocks) == 10 and min(blocks) == 1  # uneven chunks
    args = megatron_args(result)
    assert "--pipeline-model-parallel-layout" in args
    assert built_partition(transformer_config(args)) == blocks


def _moe(result, **plan):
    model = result.model.model_dump(mode="json") | {"num_experts": 8, "moe_top_k": 2}
    return changed(result, plan=plan, model=model)


def test_expert_parallelism_is_exported_with_the_expert_count():
    result = _moe(load_plan("llama8b_3d_vpp_sp"), ep=2)  # tp=4 with SP, dp=2
    args = megatron_args(result)
    config = transformer_config(args)  # megatron-core checks EP against its MoE settings
    assert (config.expert_model_parallel_size, config.num_moe_experts,
            config.moe_router_topk) == (2, 8, 2)
    # megatron-core refuses EP without the expert count: the flag we add is the one it needs.
    without = [a for i, a in enumerate(args) if a != "--num-experts"
               and (i == 0 or args[i - 1] != "--num-experts")]
    with pytest.raises(Exception, match="num_moe_experts"):
        transformer_config(without)


def test_expert_parallelism_with_tp_needs_sequence_parallelism():
    result = _moe(load_plan("llama8b_3d_vpp_sp"), ep=2, sequence_parallel=False)
    with pytest.raises(ExportError, match="needs sequence parallelism"):
        megatron_args(result)


def test_the_launch_overlaps_what_the_cost_model_prices_as_overlapped():
    # megatron-core's DistributedDataParallelConfig defaults both to False; the megatron
    # runtime profile prices them on, so the launch must ask for them (Megatron-LM copies
    # --overlap-grad-reduce / --overlap-param-gather into these same-named fields).
    ddp = require("megatron.core.distributed.distributed_data_parallel_config")
    from autoplan.costmodels.profiles import runtime_profile
    defaults = ddp.DistributedDataParallelConfig()
    assert defaults.overlap_grad_reduce is False and defaults.overlap_param_gather is False
    profile = runtime_profile("megatron")
    result = changed(load_plan("llama8b_3d_vpp_sp"), plan={"zero_stage": 1})
    args = megatron_args(result)
    assert profile.overlap_grad_reduce and "--overlap-grad-reduce" in args
    assert profile.overlap_param_gather and "--overlap-param-gather" in args
    assert "--overlap-param-gather" not in megatron_args(changed(result, plan={"zero_stage": 0}))


def test_fp8_plan_exports_te_hybrid_fp8_that_transformer_config_takes():
    result = load_plan("llama8b_3d_vpp_sp")
    training = {**result.training.model_dump(mode="json"), "precision": "fp8"}
    args = megatron_args(changed(result, training=training))
    # Megatron-LM's FP8 (examples/llama/train_llama3_8b_h100_fp8.sh): bf16 params with TE's
    # hybrid format, delayed scaling; --fp8-format is TransformerConfig.fp8
    assert "--bf16" in args and "--fp16" not in args
    config = transformer_config(args)
    assert (config.fp8, config.fp8_recipe, config.bf16) == ("hybrid", "delayed", True)
    assert config.transformer_impl == "transformer_engine"
    # FP8 weights (NeMo's bf16_with_fp8_mixed) need the distributed optimizer: at ZeRO 1 only
    assert ("--fp8-param-gather" in args) == (result.plan.zero_stage >= 1)


def test_fp8_with_megatrons_local_layers_is_refused():
    result = load_plan("llama8b_3d_vpp_sp")
    training = {**result.training.model_dump(mode="json"), "precision": "fp8",
                "transformer_impl": "local"}
    with pytest.raises(ExportError, match="Transformer Engine"):
        megatron_args(changed(result, training=training))


def test_exported_fp8_command_reads_back_as_fp8(tmp_path):
    result = load_plan("llama8b_3d_vpp_sp")
    training = {**result.training.model_dump(mode="json"), "precision": "fp8"}
    saved = tmp_path / "launch.sh"
    saved.write_text("torchrun pretrain_gpt.py " + " ".join(megatron_args(
        changed(result, training=training))) + "\n")
    assert read_run(saved).precision == "fp8"


def test_a_plan_priced_with_the_tp_overlap_launches_it_with_sequence_parallelism():
    # Megatron-LM copies --tp-comm-overlap into ModelParallelConfig.tp_comm_overlap and asserts
    # sequence parallelism with it (arguments.py: "Tensor parallel communication/GEMM overlap
    # can happen only when sequence parallelism is enabled").
    result = load_plan("llama8b_3d_vpp_sp")
    training = {**result.training.model_dump(mode="json"), "tp_comm_overlap": True}
    config = transformer_config(megatron_args(changed(result, training=training)))
    assert config.tp_comm_overlap and config.sequence_parallel
    assert "--tp-comm-overlap" not in megatron_args(result)
