"""The optimizer in backward (torchtune's ``optimizer_in_bwd``): each parameter is stepped, and
its gradient freed, from its post-accumulate-grad hook, so a GPU holds one layer's gradients,
not the model's; gradient accumulation and runtimes without it are refused (exit 2)."""

import types

import pytest
import torch
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.costmodels.memory import model_state_bytes
from autoplan.costmodels.profiles import runtime_profile
from autoplan.errors import ConstraintError, ExportError
from autoplan.plan import Offload
from autoplan.plugins import render_all
from autoplan.zoo import Llama, LlamaConfig, next_token_loss

SMALL = LlamaConfig(num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=4,
                    ffn_hidden_size=688, vocab_size=1024)
# One block: q, k, v, o (4 x 256^2 = 262,144), gate, up, down (3 x 256 x 688 = 528,384) and
# two RMSNorm weights (2 x 256): 791,040 parameters, more than the embedding or the head
# (1024 x 256 = 262,144 each).
BLOCK_PARAMS = 4 * 256 * 256 + 3 * 256 * 688 + 2 * 256
GPU = {"gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 2,
       "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"}}


@pytest.fixture(scope="module")
def small():
    module = types.ModuleType("small_llama")
    module.build_model = lambda: Llama(SMALL)
    module.loss = next_token_loss
    return api.load_model(module)


def _estimate(model, pins, **kw):
    return api.estimate(model, GPU, pins, seq_len=128, global_batch=kw.pop("batch", 2),
                        runtime="fsdp", **kw)


def test_gradients_are_the_largest_layer_s(small):
    fsdp = runtime_profile("fsdp")
    assert (fsdp.grad_bytes, fsdp.fp32_grad_bytes) == (2, 0)  # bf16 gradients only
    stepped = _estimate(small, {"dp": 1, "mbs": 2}, optimizer_in_backward=True).estimate
    after = _estimate(small, {"dp": 1, "mbs": 2}).estimate
    total = sum(p.numel() for p in Llama(SMALL).parameters())  # torch's own count
    gib = 2**30
    assert stepped.memory_breakdown_gib["gradients"] == pytest.approx(2 * BLOCK_PARAMS / gib)
    assert after.memory_breakdown_gib["gradients"] == pytest.approx(2 * total / gib)
    assert stepped.memory_breakdown_gib["optimizer"] == after.memory_breakdown_gib["optimizer"]


def test_sharded_gradients_of_one_layer(small):
    # FULL_SHARD over 2: the hook steps the reduce-scattered half of the block's gradients.
    stepped = _estimate(small, {"dp": 2, "mbs": 1, "zero": 3},
                        optimizer_in_backward=True).estimate
    assert stepped.memory_breakdown_gib["gradients"] == pytest.approx(
        2 * BLOCK_PARAMS / 2 / 2**30)


def test_the_formula_holds_the_given_gradients():
    fsdp = runtime_profile("fsdp")
    states = model_state_bytes(1000, zero_stage=2, dp=4, offload=Offload.NONE, runtime=fsdp,
                               grads_held=100)
    assert states.gradients == 2 * 100 / 4  # bf16 gradient of 100 parameters, sharded over 4
    assert states.optimizer == (4 + 8) * 1000 / 4  # every parameter keeps its Adam state


def _peak_grad_elements(model: torch.nn.Module, in_backward: bool) -> int:
    """Most gradient elements alive at once during one real backward on CPU, with an AdamW
    per parameter stepped from ``register_post_accumulate_grad_hook`` as torchtune's
    ``optimizer_in_bwd`` does (``training.register_optim_in_bwd_hooks``), or one AdamW
    stepped after backward."""
    params = [p for p in model.parameters() if p.requires_grad]
    peak = 0

    def alive() -> int:
        return sum(p.grad.numel() for p in params if p.grad is not None)

    if in_backward:
        optimizers = {p: torch.optim.AdamW([p], foreach=False) for p in params}

        def step(param):
            nonlocal peak
            peak = max(peak, alive())
            optimizers[param].step()
            optimizers[param].zero_grad(set_to_none=True)

        for p in params:
            p.register_post_accumulate_grad_hook(step)
    tokens = torch.randint(0, SMALL.vocab_size, (1, 16))
    next_token_loss(model(tokens), tokens).backward()
    if not in_backward:
        peak = alive()
        torch.optim.AdamW(params, foreach=False).step()
    return peak


def test_a_real_backward_holds_at_most_one_layer_of_gradients():
    torch.manual_seed(0)
    total = sum(p.numel() for p in Llama(SMALL).parameters())
    assert _peak_grad_elements(Llama(SMALL), in_backward=False) == total
    stepped = _peak_grad_elements(Llama(SMALL), in_backward=True)
    largest_param = 688 * 256  # one MLP weight
    assert largest_param <= stepped <= BLOCK_PARAMS < total / 4


def test_gradient_accumulation_is_refused(small):
    with pytest.raises(ConstraintError, match="2 micro-batches per step would accumulate"):
        _estimate(small, {"dp": 1, "mbs": 1}, optimizer_in_backward=True)
    # dp defaults to both GPUs: 4 sequences in micro-batches of 1 are 2 per rank.
    with pytest.raises(ConstraintError, match="cannot accumulate gradients over 2 micro-batches"):
        _estimate(small, {"mbs": 1}, batch=4, optimizer_in_backward=True)
    with pytest.raises(ConstraintError, match="dp\\*mbs equal --global-batch"):
        api.solve(small, GPU, seq_len=128, global_batch=8, runtime="fsdp",
                  pins={"dp": 2, "mbs": 2}, optimizer_in_backward=True)


def test_solve_plans_one_micro_batch_per_step(small):
    result = api.solve(small, GPU, seq_len=128, global_batch=8, optimizer_in_backward=True,
                       time_limit_s=20)
    assert result.training.runtime == "fsdp" and result.training.optimizer_in_backward
    assert result.plan.num_microbatches == 1
    assert {o.runtime: o.status for o in result.runtimes}["megatron"] == "INVALID"


@pytest.mark.parametrize("runtime, name", [("megatron", "Megatron-LM"),
                                           ("deepspeed", "DeepSpeed")])
def test_runtimes_without_it_exit_2(tmp_path, runtime, name):
    model = tmp_path / "tiny.py"
    model.write_text("from autoplan.zoo import Llama, LlamaConfig\n"
                     "def build_model():\n"
                     "    return Llama(LlamaConfig(2, 64, 4, 4, 128, vocab_size=256))\n")
    cluster = tmp_path / "gpu.yaml"
    cluster.write_text("gpu: a100-sxm4-80gb\nnodes: 1\ngpus_per_node: 1\n")
    result = CliRunner().invoke(app, ["estimate", str(model), str(cluster), "--seq-len", "64",
                                      "--global-batch", "1", "--runtime", runtime,
                                      "--optimizer-in-backward"])
    assert result.exit_code == 2, result.output
    assert f"{name} steps the optimizer after the whole backward" in result.output


def test_the_report_says_it_and_exporters_without_it_refuse(small):
    result = _estimate(small, {"dp": 1, "mbs": 2}, optimizer_in_backward=True)
    assert result.model_dump(mode="json")["training"]["optimizer_in_backward"] is True
    assert "optimizer_in_backward" not in _estimate(small, {"dp": 1, "mbs": 2}).model_dump(
        mode="json")["training"]  # left out when false: older documents unchanged
    from autoplan.plugins.summary import fine_tuning_line
    assert "stepped in backward" in fine_tuning_line(result)
    with pytest.raises(ExportError, match="no optimizer step in backward"):
        render_all(result, "torchtitan")
    explained = api.explain(result, small).fine_tuning
    assert "one layer's gradients at a time" in explained
