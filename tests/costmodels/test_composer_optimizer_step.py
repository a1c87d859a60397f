"""llm-foundry's optimizer step as Composer runs it: DecoupledAdamW's per-parameter loop of
in-place tensor ops after FSDP1's clip_grad_norm_, each op its own pass over the fp32 shard;
checked against a count of Composer's ops worked by hand and the HBM bandwidth."""

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.costmodels.profiles import compute_profile
from autoplan.costmodels.step import estimate
from autoplan.training import Pins
from more_runs import _runtime_settings
from published_runs import _gpt_module, selene

L, H, A, V, S = 2, 1024, 16, 1024, 256
DP = 8


def _optimizer_s(**settings) -> tuple[float, float]:
    """(optimizer seconds, the model's parameters) of a ZeRO-3 FSDP plan on one DGX A100."""
    model = load_model(_gpt_module(L, H, A, V, S))
    problem = make_problem(model, load_cluster(selene(DP)),
                           training_spec(S, DP, "bf16", "fsdp", "flash"),
                           runtime_settings=settings)
    plan = plan_from_pins(problem, Pins(tp=1, pp=1, dp=DP, mbs=1, zero=3))
    return estimate(problem, plan).time_breakdown_s["optimizer"], problem.graph.num_params


def test_llm_foundry_step_moves_96_bytes_per_parameter():
    # composer/optim/decoupled_weight_decay.py, weight_decay 0 (no param.mul_):
    #   exp_avg.mul_ r1 w1; exp_avg.add_(grad) r2 w1; exp_avg_sq.mul_ r1 w1;
    #   exp_avg_sq.addcmul_(grad, grad) r3 w1; sqrt() r1 w1; / c r1 w1; add_(eps) r1 w1;
    #   param.addcdiv_(exp_avg, denom) r3 w1            -> 13 reads, 8 writes
    # FSDP1 clip_grad_norm_: vector_norm(grad) r1; grad.mul_(coef) r1 w1 -> 2 reads, 1 write
    # 24 fp32 tensor passes = 96 bytes per parameter of the shard.
    assert _runtime_settings("LLMF")["optimizer_step_traffic_bytes"] == 15 * 4 + 9 * 4


def test_per_op_step_time_is_the_shard_through_hbm():
    # The GPU's shard (params / 8) moves 96 bytes per parameter through A100-80GB's
    # 2.039 TB/s at the profile's memory efficiency; the fused default moves
    # 2 * (4 master + 8 moments) + 2 weight + 2 gradient = 28.
    per_op, params = _optimizer_s(optimizer_step_traffic_bytes=96)
    fused, _ = _optimizer_s()
    rate = 2.039e12 * compute_profile("a100-sxm4-80gb").memory_efficiency
    assert per_op == pytest.approx(params / DP * 96 / rate, rel=1e-6)
    assert fused == pytest.approx(params / DP * 28 / rate, rel=1e-6)
