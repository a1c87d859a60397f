"""PEFT LoRA and QLoRA models trace and plan: peft's own trainable count, adapters split as
their base Linear, and QLoRA's rules of thumb (Dettmers et al. 2023): LoRA of a 7B model fits
one 24 GB GPU, QLoRA of a 65B model one 48 GB GPU (a bf16 base does not), of a 33B model 24 GB.
Each model is traced once, at the QLoRA paper's sequence length of 512."""

import json
import types
from pathlib import Path

import pytest

from autoplan import api
from autoplan.graph.layer_graph import TpSplit

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
L40S = EXAMPLES / "clusters" / "l40s-x1.yaml"
RTX4090 = EXAMPLES / "clusters" / "rtx4090-x1.yaml"
QLORA = {"optimizer": "adamw8bit", "frozen_dtype": "nf4"}


def _estimate(model, cluster, **kw):
    return api.estimate(model, cluster, {"mbs": 1, "recompute": "full"}, seq_len=512,
                        global_batch=16, **kw).estimate


@pytest.fixture(scope="module")
def lora_7b():
    return api.load_model(EXAMPLES / "models" / "hf_llama2_7b_lora.py")


@pytest.fixture(scope="module")
def lora_65b():
    return api.load_model(EXAMPLES / "models" / "hf_llama_65b_lora.py")


def test_the_trainable_count_is_peft_s_own(lora_7b):
    import torch
    module = lora_7b.source
    with torch.device("meta"):
        model = module.build_model()
    trainable, total = model.get_nb_trainable_parameters()
    graph = lora_7b.trace(512)
    assert (graph.num_trainable_params, graph.num_params) == (trainable, total)


def test_adapters_are_split_as_their_base_linear(lora_7b):
    block = lora_7b.trace(512).layers[2]
    splits = {g.name: g.split for g in block.gemms}
    for gemm in block.gemms:
        if gemm.adapter:
            base = gemm.name.rsplit(".lora_", 1)[0] + ".base_layer"
            assert gemm.split is splits[base] is not TpSplit.NONE
            assert gemm.wgrad and 16 in (gemm.in_features, gemm.out_features)
        else:
            assert not gemm.wgrad and gemm.dgrad
    assert block.tp_allreduces == 2  # attention out and MLP down; the adapters add none


def test_a_7b_lora_fits_one_24gb_gpu(lora_7b):
    assert _estimate(lora_7b, RTX4090).feasible


def test_qlora_of_65b_fits_one_48gb_gpu_and_a_bf16_base_does_not(lora_65b):
    qlora = _estimate(lora_65b, L40S, **QLORA)
    assert qlora.feasible
    # 65.2B frozen Linear weights at 4.127 bits = 31.3 GiB; bf16 would be 121 GiB.
    assert 31 < qlora.memory_breakdown_gib["weights"] < 33.5
    assert not _estimate(lora_65b, L40S, optimizer="adamw8bit", frozen_dtype="bf16").feasible


def test_qlora_of_33b_fits_one_24gb_gpu():
    config = transformers.LlamaConfig(num_hidden_layers=60, hidden_size=6656,
                                      num_attention_heads=52, num_key_value_heads=52,
                                      intermediate_size=17920, vocab_size=32000)
    lora = peft.LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM")
    module = types.ModuleType("llama_33b_lora")
    module.build_model = lambda: peft.get_peft_model(transformers.LlamaForCausalLM(config), lora)
    assert _estimate(api.load_model(module), RTX4090, **QLORA).feasible


def test_dequantizing_the_4bit_base_costs_step_time(lora_65b):
    nf4 = _estimate(lora_65b, L40S, **QLORA)
    bf16 = _estimate(lora_65b, L40S, optimizer="adamw8bit")
    # Each use reads 0.52 B and writes 2 B per frozen weight: fwd, recomputed fwd, dgrad.
    uses = 3 * 16 * 65.0e9 * (4.127 / 8 + 2)
    seconds = uses / (864e9 * 0.8)  # L40S HBM at the default streaming efficiency
    assert nf4.step_time_s - bf16.step_time_s == pytest.approx(seconds, rel=0.05)


TINY_LORA = """
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

def build_model():
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, vocab_size=256)
    return get_peft_model(LlamaForCausalLM(config),
                          LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
"""


def test_the_cli_flags_and_json_keys(tmp_path):
    from typer.testing import CliRunner

    from autoplan.cli import app
    model = tmp_path / "tiny_lora.py"
    model.write_text(TINY_LORA)
    args = ["estimate", str(model), str(RTX4090), "--seq-len", "64", "--global-batch", "4",
            "--optimizer", "adamw8bit", "--frozen-dtype", "nf4", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert 0 < document["model"]["num_trainable_params"] < document["model"]["num_params"]
    assert (document["training"]["optimizer"], document["training"]["frozen_dtype"]) == (
        "adamw8bit", "nf4")
    bad = CliRunner().invoke(app, [*args[:-3], "--frozen-dtype", "fp8"])
    assert bad.exit_code == 2 and "--frozen-dtype 'fp8' is not known" in bad.output


def test_the_report_and_explain_say_what_fine_tuning_trained_and_saved(tmp_path):
    from rich.console import Console

    from autoplan.report import render
    model = tmp_path / "tiny_lora.py"
    model.write_text(TINY_LORA)
    loaded = api.load_model(model)
    result = api.solve(loaded, RTX4090, seq_len=64, global_batch=4, frozen_dtype="nf4",
                       time_limit_s=20)
    console = Console(record=True, width=200)
    render(result, console)
    graph = loaded.trace(64)
    frozen = graph.num_params - graph.num_trainable_params
    text = console.export_text()
    assert f"Trains {graph.num_trainable_params:,} parameters" in text
    assert f"{frozen:,} frozen" in text and "stored in nf4" in text
    saved = api.explain(result, loaded).fine_tuning
    assert saved.startswith(f"against training all {graph.num_params:,} parameters with AdamW")


def test_options_yaml_keys_optimizer_and_frozen_dtype(tmp_path):
    model = tmp_path / "tiny_lora.py"
    model.write_text(TINY_LORA)
    options = tmp_path / "options.yaml"
    options.write_text("optimizer: sgd\nfrozen_dtype: int8\n")
    loaded = api.load_model(model)
    result = api.solve(loaded, RTX4090, seq_len=64, global_batch=4, options=options,
                       time_limit_s=20)
    assert (result.training.optimizer, result.training.frozen_dtype) == ("sgd", "int8")
    flag = api.solve(loaded, RTX4090, seq_len=64, global_batch=4, options=options,
                     optimizer="adamw", time_limit_s=20)  # a flag wins over the file
    assert flag.training.optimizer == "adamw"
    options.write_text("optimizer: lion\n")
    with pytest.raises(api.ConstraintError, match="optimizer"):
        api.solve(loaded, RTX4090, seq_len=64, global_batch=4, options=options)
