"""Fine-tuning is priced by what trains: gradients and optimizer state against formulas
worked by hand for the trainable count, the step of a partly frozen model against the full
one, and the rules of thumb of QLoRA (Dettmers et al. 2023, sec. 1 and 4): a 7B model's full
fine-tune does not fit one 80 GB GPU, its LoRA fits 24 GB, QLoRA of 65B fits one 48 GB GPU
(not with a bf16 base), QLoRA of 33B fits 24 GB."""

import types

import pytest

from autoplan import api
from autoplan.costmodels.memory import model_state_bytes
from autoplan.costmodels.profiles import runtime_profile
from autoplan.plan import Offload
from autoplan.training import Optimizer
from autoplan.zoo import Llama, LlamaConfig, next_token_loss

GIB = 2**30
LLAMA_7B = LlamaConfig(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                       ffn_hidden_size=11008)
WO_PARAMS = 32 * 4096 * 4096  # the 32 attention output projections: 536,870,912
SINGLE_A100 = {"gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 1,
               "intra_node": {"link": "pcie", "bandwidth": "32GB/s"}}
EIGHT_A100 = {"gpu": "a100-sxm4-80gb", "nodes": 1, "gpus_per_node": 8,
              "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"}}


def _model(name, config, trains=lambda name: True):
    module = types.ModuleType(name)

    def build_model():
        model = Llama(config)
        for param_name, p in model.named_parameters():
            p.requires_grad = trains(param_name)
        return model

    module.build_model = build_model
    module.loss = next_token_loss
    return api.load_model(module)


@pytest.fixture(scope="module")
def full_7b():
    return _model("llama7b_full", LLAMA_7B)


@pytest.fixture(scope="module")
def wo_only_7b():
    """Every weight frozen but the attention output projections (8% of the parameters)."""
    return _model("llama7b_wo", LLAMA_7B, lambda name: name.endswith("attention.wo.weight"))


def _estimate(model, cluster=SINGLE_A100, **kw):
    pins = {"mbs": 1, "recompute": "full", **kw.pop("pins", {})}
    return api.estimate(model, cluster, pins, seq_len=512, global_batch=kw.pop("batch", 16),
                        **kw).estimate


def test_only_the_trained_parameters_keep_gradients_and_adam_state(wo_only_7b):
    assert wo_only_7b.trace(512).num_trainable_params == WO_PARAMS
    memory = _estimate(wo_only_7b).memory_breakdown_gib
    # Megatron: fp32 main grads (4 B) and fp32 master + two moments (12 B) per trained param.
    assert memory["gradients"] == pytest.approx(4 * WO_PARAMS / GIB)  # 2.0 GiB
    assert memory["optimizer"] == pytest.approx(12 * WO_PARAMS / GIB)  # 6.0 GiB


@pytest.mark.parametrize("optimizer, state_bytes", [
    ("adamw8bit", 2 + 2 * 4 / 256),  # two uint8 states, one fp32 absmax each per 256 values
    ("sgd", 4),  # one fp32 momentum buffer
])
def test_optimizer_state_per_trained_parameter(wo_only_7b, optimizer, state_bytes):
    memory = _estimate(wo_only_7b, optimizer=optimizer).memory_breakdown_gib
    assert memory["optimizer"] == pytest.approx((4 + state_bytes) * WO_PARAMS / GIB)


def test_zero_shards_only_what_is_trained(wo_only_7b):
    memory = _estimate(wo_only_7b, EIGHT_A100, runtime="deepspeed",
                       pins={"dp": 8, "zero": 2}).memory_breakdown_gib
    # DeepSpeed ZeRO-2 over 8: bf16 grads (2 B) / 8, fp32 grad partition (4 B) / 8 with the
    # state, fp32 master + moments (12 B) / 8, for the trained parameters only.
    assert memory["gradients"] == pytest.approx((2 + 4) * WO_PARAMS / 8 / GIB)
    assert memory["optimizer"] == pytest.approx(12 * WO_PARAMS / 8 / GIB)


def test_gradient_and_optimizer_memory_are_the_trainable_share_of_full_trainings(
        full_7b, wo_only_7b):
    full = _estimate(full_7b).memory_breakdown_gib
    frozen = _estimate(wo_only_7b).memory_breakdown_gib
    share = WO_PARAMS / full_7b.trace(512).num_params
    for part in ("gradients", "optimizer"):
        assert frozen[part] == pytest.approx(share * full[part], rel=0.05)


def test_a_model_with_frozen_layers_steps_faster(full_7b, wo_only_7b):
    """No weight-gradient GEMMs but the output projections', no backward of the first
    block's attention, and 8% of the gradients to reduce: at most 0.85x the full step."""
    full = _estimate(full_7b, EIGHT_A100, pins={"dp": 8}, batch=64)
    frozen = _estimate(wo_only_7b, EIGHT_A100, pins={"dp": 8}, batch=64)
    assert frozen.step_time_s <= 0.85 * full.step_time_s
    assert frozen.time_breakdown_s["dp_comm"] <= 0.1 * full.time_breakdown_s["dp_comm"]


def test_a_7b_full_fine_tune_does_not_fit_one_80gb_gpu(full_7b):
    # 16 bytes per parameter of mixed-precision Adam: 6.7B x 16 = 108 GB > 80 GB.
    assert not _estimate(full_7b).feasible
    # ZeRO-Offload's optimizer state on the CPU leaves 2 + 4 bytes (weights, fp32 main grads)
    # per parameter: 40 GB.
    assert _estimate(full_7b, pins={"offload": "optimizer"}).feasible


def test_frozen_weights_keep_no_state_in_the_formula():
    megatron = runtime_profile("megatron")
    states = model_state_bytes(1000, zero_stage=0, dp=1, offload=Offload.NONE, runtime=megatron,
                               trained=10, weight_bytes=2000, optimizer=Optimizer.SGD)
    assert (states.weights, states.gradients, states.optimizer) == (2000, 4 * 10, (4 + 4) * 10)
