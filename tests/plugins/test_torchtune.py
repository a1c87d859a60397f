"""torchtune overrides against torchtune 0.6.1's own recipes and configs (they ship in its
wheel: recipes/*.py, recipes/configs/**.yaml): each key is in the recipe's shipped config or
read by the recipe's code, ``~`` keys exist to remove, the LoRA keys are arguments of the
config's model builder, and the optimizer's arguments after the overrides bind to the
optimizer named. The sources are read, not imported (torchtune's import takes seconds)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

from autoplan.errors import ExportError
from autoplan.plan import LoraInfo
from autoplan.plugins import render_all
from autoplan.plugins.torchtune import EXAMPLE_CONFIGS, recipe, torchtune_overrides
from tests.extras import require, require_installed
from tests.plugins.plans import changed, load_plan

omegaconf = require("omegaconf")
SITE = require_installed("torchtune")
RECIPES = SITE / "recipes"

LORA = LoraInfo(rank=16, alpha=32.0, dropout=0.05,
                targets=("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                         "v_proj"))


def _one_gpu(**plan):
    return changed(load_plan("llama8b_zero3_offload_1gpu"), plan={
        "zero_stage": 0, "offload": "none", **plan})


def _lora(result, lora=LORA, **training):
    model = result.model.model_copy(update={"num_trainable_params": 41_943_040, "lora": lora})
    return changed(result, model=model.model_dump(mode="json"), training={
        **result.training.model_dump(mode="json"), **training})


def _full(result, **training):
    return changed(result, training={**result.training.model_dump(mode="json"), **training})


def _eight_gpus(**plan):
    one = load_plan("llama8b_zero3_offload_1gpu")
    cluster = {**one.cluster, "name": "one DGX", "gpus_per_node": 8,
               "intra_node": {"link": "nvswitch"}}
    return changed(one, plan={"dp": 8, "world_size": 8, "zero_stage": 3, "offload": "none",
                              "num_microbatches": 2, **plan}, cluster=cluster)


CASES = {
    "lora_one_gpu_qlora": (_lora(_one_gpu(), optimizer="adamw8bit", frozen_dtype="nf4",
                                 runtime="fsdp"), "llama2/7B_qlora_single_device"),
    "lora_eight_gpus": (_lora(_eight_gpus(), optimizer="sgd", runtime="fsdp"), "llama2/7B_lora"),
    "full_one_gpu_in_backward": (
        _full(_one_gpu(num_microbatches=1, global_batch_size=1), optimizer_in_backward=True,
              runtime="fsdp", global_batch=1), "llama2/7B_full_low_memory"),
    "full_one_gpu_offloaded": (_full(load_plan("llama8b_zero3_offload_1gpu")),
                               "llama2/7B_full"),
    "full_eight_gpus_tp": (
        _full(_eight_gpus(tp=2, dp=4, num_microbatches=4, zero_stage=2),
              optimizer="adamw8bit"), "llama3_1/70B_full"),
}


def _config(name: str):
    return omegaconf.OmegaConf.load(RECIPES / "configs" / f"{name}.yaml")


def _read_by_recipe(recipe_name: str, key: str) -> bool:
    source = (RECIPES / f"{recipe_name}.py").read_text()
    return re.search(rf'cfg\.get\(\s*"{key}"|cfg\.{key}\b|cfg\["{key}"\]', source) is not None


def _applied(config, overrides: list[str]):
    """The config after the overrides as ``tune run`` applies them (~ removes a key; the rest
    merge over the YAML as an OmegaConf dotlist, torchtune.config._utils)."""
    data = omegaconf.OmegaConf.to_container(config)
    for removed in (o[1:] for o in overrides if o.startswith("~")):
        *parents, leaf = removed.split(".")
        node = data
        for part in parents:
            node = node[part]
        del node[leaf]  # KeyError: tune run says "Could not find key ... to remove"
    dotlist = [o.replace("=None", "=!!null") for o in overrides if not o.startswith("~")]
    return omegaconf.OmegaConf.merge(omegaconf.OmegaConf.create(data),
                                     omegaconf.OmegaConf.from_dotlist(dotlist))


def _source_params(package: Path, name: str) -> set[str]:
    """Parameter names of function or class ``name`` defined under ``package`` (following
    ``name = partial(other, ...)`` as torchtune's qlora builders are), read with ast."""
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return {a.arg for a in node.args.args + node.args.kwonlyargs}
            if isinstance(node, ast.ClassDef) and node.name == name:
                init = next(n for n in node.body
                            if isinstance(n, ast.FunctionDef) and n.name == "__init__")
                return {a.arg for a in init.args.args + init.args.kwonlyargs} - {"self"}
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "partial"
                    and any(getattr(t, "id", None) == name for t in node.targets)):
                return _source_params(package, node.value.args[0].id)
    raise AssertionError(f"{name} is not defined under {package}")


def _component_params(component: str) -> set[str]:
    """The arguments of an optimizer component: torch's by inspection, torchao's from its
    source (torchao is installed with torchtune's test extra, not imported here)."""
    module, name = component.rsplit(".", 1)
    if module.startswith("torch."):
        return set(inspect.signature(getattr(torch.optim, name)).parameters) - {"params"}
    ao = require_installed("torchao") / module.replace(".", "/")
    return _source_params(ao, name) - {"params"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_override_is_a_key_torchtune_knows(case):
    result, config_name = CASES[case]
    name = recipe(result)
    config, overrides = _config(config_name), torchtune_overrides(result)
    for override in overrides:
        key = override.lstrip("~").split("=")[0]
        top = key.split(".")[0]
        if override.startswith("~"):
            assert omegaconf.OmegaConf.select(config, key) is not None, override
        elif top == "model":
            builder = config.model._component_
            package = SITE / "/".join(builder.split(".")[:-1])
            assert key.split(".")[1] in _source_params(package, builder.rsplit(".", 1)[1]), override
        elif top != "optimizer":
            assert top in config or _read_by_recipe(name, top), (override, name)
    optimizer = _applied(config, overrides).optimizer
    kwargs = set(optimizer) - {"_component_"}
    assert kwargs <= _component_params(optimizer._component_), (optimizer, case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_overrides_set_the_plan(case):
    result, config_name = CASES[case]
    merged = _applied(_config(config_name), torchtune_overrides(result))
    plan = result.plan
    assert (merged.batch_size, merged.gradient_accumulation_steps, merged.dtype) == (
        plan.micro_batch_size, plan.num_microbatches, "bf16")
    assert merged.enable_activation_checkpointing is (plan.recompute.value == "full")
    assert merged.enable_activation_offloading is False
    if result.model.lora is not None:
        assert list(merged.model.lora_attn_modules) == ["q_proj", "k_proj", "v_proj",
                                                        "output_proj"]
        assert (merged.model.lora_rank, merged.model.lora_alpha, merged.model.apply_lora_to_mlp,
                merged.model.apply_lora_to_output) == (16, 32, True, False)
        assert merged.model.quantize_base is (result.training.frozen_dtype == "nf4")
    if plan.world_size > 1:
        assert merged.fsdp_reshard_after_forward is (plan.zero_stage == 3)
    if "tensor_parallel_dim" in merged:
        assert merged.tensor_parallel_dim == plan.tp


def test_the_recipe_and_example_configs_are_torchtune_s():
    names = {case: recipe(result) for case, (result, _) in CASES.items()}
    assert names == {"lora_one_gpu_qlora": "lora_finetune_single_device",
                     "lora_eight_gpus": "lora_finetune_distributed",
                     "full_one_gpu_in_backward": "full_finetune_single_device",
                     "full_one_gpu_offloaded": "full_finetune_distributed",
                     "full_eight_gpus_tp": "full_finetune_distributed"}
    registry = (SITE / "torchtune" / "_recipe_registry.py").read_text()
    for name, config in EXAMPLE_CONFIGS.items():
        assert (RECIPES / f"{name}.py").is_file()
        block = registry[registry.index(f'name="{name}"'):]
        block = block[:block.find("Recipe(")] if "Recipe(" in block else block
        assert f'name="{config}"' in block, (name, config)


def test_qlora_builders_are_lora_builders_quantizing_the_base():
    # qlora_llama2_7b = partial(lora_llama2_7b, quantize_base=True): model.quantize_base=True
    # on a LoRA config builds the same model as the QLoRA builder.
    source = (SITE / "torchtune" / "models" / "llama2" / "_model_builders.py").read_text()
    assert "qlora_llama2_7b = partial(lora_llama2_7b, quantize_base=True)" in source


def test_the_recipes_refuse_what_the_exporter_refuses():
    full = (RECIPES / "full_finetune_distributed.py").read_text()
    assert "Gradient accumulation is not supported with optimizer in bwd" in full
    assert "DDP is currently not supported" in full
    assert "full fp16 training is not supported" in full
    assert not _read_by_recipe("lora_finetune_distributed", "optimizer_in_bwd")
    assert not _read_by_recipe("lora_finetune_distributed", "tensor_parallel_dim")
    assert _read_by_recipe("full_finetune_distributed", "tensor_parallel_dim")


@pytest.mark.parametrize("result, reason", [
    (changed(_eight_gpus(), plan={"zero_stage": 0}), "DDP is currently not supported"),
    (changed(_one_gpu(), plan={"recompute": "selective"}), "wraps whole blocks"),
    (_lora(_eight_gpus(tp=2, dp=4, num_microbatches=4)), "LoRA recipes have no tensor"),
    (_lora(_one_gpu(num_microbatches=1, global_batch_size=1), optimizer_in_backward=True,
           global_batch=1), "LoRA recipes have no optimizer_in_bwd"),
    (_lora(_one_gpu(), frozen_dtype="int8"), "bf16 or NF4"),
    (_lora(_one_gpu(), lora=LORA.model_copy(update={"targets": ("q_proj", "up_proj")})),
     "all three MLP Linears or none"),
    (_lora(_one_gpu(), lora=LORA.model_copy(update={"targets": ("c_attn",)})),
     "c_attn have no torchtune LoRA"),
    (changed(_full(_one_gpu()), model={**_one_gpu().model.model_dump(mode="json"),
                                        "num_trainable_params": 10}),
     "without PEFT LoRA adapters"),
    (changed(_eight_gpus(tp=2, dp=4, num_microbatches=4, sequence_parallel=True)),
     "no sequence parallelism"),
    (_full(_one_gpu(), precision="fp16"), "bf16 only"),
])
def test_what_torchtune_cannot_run_is_refused_with_the_reason(result, reason):
    with pytest.raises(ExportError, match=re.escape(reason)):
        render_all(result, "torchtune")


def test_the_launch_script_runs_tune_run_on_every_node():
    result = _lora(_eight_gpus(), runtime="fsdp")
    files = render_all(result, "torchtune")
    script = files["launch_torchtune.sh"]
    assert ('exec tune run --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" --node_rank '
            '"$NODE_RANK" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" lora_finetune_distributed '
            '--config "$TORCHTUNE_CONFIG"') in script
    overrides = [line for line in files["torchtune_overrides.txt"].splitlines()
                 if line and not line.startswith("#")]
    assert overrides == torchtune_overrides(result)
    assert "# Recipe: lora_finetune_distributed. Command: tune run --nnodes 1 --nproc_per_node 8" \
        in files["torchtune_overrides.txt"]
