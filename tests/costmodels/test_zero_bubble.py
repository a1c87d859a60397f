"""Zero-bubble pipeline schedule (Qi et al. 2023, arXiv 2401.10241) against its stated bubble."""

import json

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.costmodels.pipeline import pipeline_time
from autoplan.costmodels.step import estimate
from autoplan.errors import ExportError
from autoplan.plan import PipelineSchedule
from autoplan.plugins.megatron import megatron_args
from autoplan.plugins.torchtitan import torchtitan_overrides
from autoplan.training import Pins
from published_runs import _gpt_module, selene
from tests.plugins.plans import changed, load_plan


def test_zero_bubble_bubble_is_a_third_of_1f1b_when_f_b_w_are_equal():
    # p = 4 equal stages, F = B = W = 1 s per micro-batch (t = 3 s), m = 8, v = 1:
    # 1F1B bubble (p-1)(F+B+W) = 9 s; ZB-H1 (p-1)(F+B-W) = 3 s (Qi et al. 2023, sec. 3).
    one_f_one_b = pipeline_time(slowest_s=3.0, total_s=12.0, num_microbatches=8, vpp=1)
    zero_bubble = pipeline_time(slowest_s=3.0, total_s=12.0, num_microbatches=8, vpp=1,
                                deferred_share=1 / 3)
    assert one_f_one_b == pytest.approx(8 * 3 + 9)
    assert zero_bubble == pytest.approx(8 * 3 + 3)


def test_interleaving_divides_the_remaining_bubble_by_the_chunks():
    # v = 2 chunks: (p-1)(F+B-W)/v = 1.5 s.
    assert pipeline_time(slowest_s=3.0, total_s=12.0, num_microbatches=8, vpp=2,
                         deferred_share=1 / 3) == pytest.approx(8 * 3 + 1.5)


@pytest.fixture(scope="module")
def problems():
    model = load_model(_gpt_module(8, 1024, 16, 1024, 512))
    return {runtime: make_problem(model, load_cluster(selene(8)),
                                  training_spec(512, 32, "bf16", runtime, "flash"))
            for runtime in ("fsdp", "megatron")}


def test_fsdp_interleaved_plans_run_zero_bubble_with_the_same_memory(problems):
    fsdp, megatron = problems["fsdp"], problems["megatron"]
    pins = Pins(tp=1, pp=4, dp=2, mbs=1, vpp=2)
    plan = plan_from_pins(fsdp, pins)
    assert plan.pipeline_schedule is PipelineSchedule.ZERO_BUBBLE
    assert plan_from_pins(megatron, pins).pipeline_schedule is None
    interleaved = plan.model_copy(update={"pipeline_schedule": None})
    zb, base = estimate(fsdp, plan), estimate(fsdp, interleaved)
    assert zb.peak_memory_gib == base.peak_memory_gib
    assert zb.time_breakdown_s["bubble"] < base.time_breakdown_s["bubble"]
    assert zb.time_breakdown_s["compute"] == base.time_breakdown_s["compute"]


def test_plan_json_without_a_schedule_is_unchanged():
    result = load_plan("llama8b_3d_vpp_sp")
    assert "pipeline_schedule" not in json.loads(result.model_dump_json())["plan"]
    zb = changed(result, plan={"pipeline_schedule": "zero_bubble"})
    assert json.loads(zb.model_dump_json())["plan"]["pipeline_schedule"] == "zero_bubble"


def test_torchtitan_runs_it_and_megatron_refuses_it():
    result = changed(load_plan("llama8b_3d_vpp_sp"), plan={"pipeline_schedule": "zero_bubble"})
    args = torchtitan_overrides(result)
    assert args[args.index("--parallelism.pipeline_parallel_schedule") + 1] == \
        "InterleavedZeroBubble"
    with pytest.raises(ExportError, match="no zero-bubble pipeline schedule"):
        megatron_args(result)
