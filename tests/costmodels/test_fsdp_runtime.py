"""The FSDP runtime as PyTorch FSDP2 and torchtitan run it: gradients reduced in fp32, and the
copy kernels of fully_shard's all-gather and reduce-scatter on the compute stream; checked
against torchtitan's own config default and times worked by hand from the HBM bandwidth."""

import inspect
import types

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.cluster.topology import group_links
from autoplan.costmodels import comm, sync
from autoplan.costmodels.profiles import compute_profile, runtime_profile
from autoplan.costmodels.step import estimate
from autoplan.training import Pins
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.extras import require
from published_runs import _gpt_module, selene

L, H, A, V, S = 2, 1024, 16, 1024, 256
DP, MBS, GLOBAL = 8, 1, 16  # two micro-batches per step


def _dp_comm(zero: int = 3, **settings) -> tuple[float, float]:
    """(dp_comm seconds, the GPU's parameters) of a ZeRO-``zero`` FSDP plan on one DGX A100."""
    model = load_model(_gpt_module(L, H, A, V, S))
    problem = make_problem(model, load_cluster(selene(DP)),
                           training_spec(S, GLOBAL, "bf16", "fsdp", "flash"),
                           runtime_settings={"zero3_overlap": 0.0, **settings})
    plan = plan_from_pins(problem, Pins(tp=1, pp=1, dp=DP, mbs=MBS, zero=zero))
    return estimate(problem, plan).time_breakdown_s["dp_comm"], problem.graph.num_params


def test_gradients_are_reduced_in_fp32_as_torchtitan_defaults():
    # torchtitan's Training config: mixed_precision_reduce defaults to "float32".
    configs = require("torchtitan.config.configs")
    owners = [c for _, c in inspect.getmembers(configs, inspect.isclass)
              if "mixed_precision_reduce" in getattr(c, "__dataclass_fields__", {})]
    assert owners and all(c.__dataclass_fields__["mixed_precision_reduce"].default == "float32"
                          for c in owners)
    assert runtime_profile("fsdp").reduce_bytes == 4


def test_fsdp2_copy_kernels_add_14_bytes_per_parameter_and_micro_batch():
    # Per micro-batch: two all-gather copy-outs (read 2 + write 2 bytes each) and one
    # reduce-scatter copy-in (read bf16 2 + write fp32 4) per parameter = 14 bytes, through
    # A100-80GB's 2.039 TB/s at the profile's memory efficiency, unhidden.
    with_copies, params = _dp_comm()
    without, _ = _dp_comm(unshard_copy_bytes=0)
    rate = 2.039e12 * compute_profile("a100-sxm4-80gb").memory_efficiency
    micro_batches = GLOBAL // (DP * MBS)
    assert with_copies - without == pytest.approx(micro_batches * 14 * params / rate, rel=1e-6)


def test_fp32_reduction_sends_4_byte_gradients():
    # The reduce-scatter per micro-batch carries 4 bytes per parameter instead of 2; the
    # gathers are the same, so dp_comm grows by the difference of the two reduce-scatters
    # (comm primitives, tests/cluster/test_comm.py), at FSDP's collective efficiency.
    fp32, params = _dp_comm(unshard_copy_bytes=0)
    bf16, _ = _dp_comm(unshard_copy_bytes=0, reduce_bytes=2)
    links = group_links(load_cluster(selene(DP)).cluster, DP, 1)
    efficiency = runtime_profile("fsdp").zero3_collective_efficiency
    extra = comm.reduce_scatter_time(4 * params, links) - comm.reduce_scatter_time(2 * params, links)
    assert fp32 - bf16 == pytest.approx(GLOBAL // (DP * MBS) * extra / efficiency, rel=1e-6)


def test_shard_grad_op_gathers_each_unit_once_per_micro_batch():
    """FSDP1 SHARD_GRAD_OP (ZeRO 2; torch/distributed/fsdp/_runtime_utils.py): per unit and
    micro-batch one all-gather before its forward, kept through its backward, and one
    reduce-scatter after it; FULL_SHARD re-gathers in the backward too. Per micro-batch and
    unit, with u units and latency l: ZeRO-3 = 2 AG + RS + 3ul, ZeRO-2 = AG + RS + 2ul, so
    3 x ZeRO-2 - 2 x ZeRO-3 = RS - AG for each of the step's micro-batches, whatever u."""
    zero3, params = _dp_comm(unshard_copy_bytes=0)
    zero2, _ = _dp_comm(zero=2, unshard_copy_bytes=0)
    links = group_links(load_cluster(selene(DP)).cluster, DP, 1)
    efficiency = runtime_profile("fsdp").zero3_collective_efficiency
    per_micro_batch = (comm.reduce_scatter_time(4 * params, links)
                       - comm.all_gather_time(2 * params, links)) / efficiency
    assert 3 * zero2 - 2 * zero3 == pytest.approx(GLOBAL // (DP * MBS) * per_micro_batch,
                                                  rel=1e-6)


def _llama_module(config: LlamaConfig):
    module = types.ModuleType("pp_llama")
    module.build_model = lambda: Llama(config)
    module.loss = next_token_loss
    return module


def _pipelined_dp_comm(microbatches: int) -> tuple[float, float]:
    """(dp_comm seconds, the larger stage's parameters) of an FSDP (ZeRO-3) plan over two
    pipeline stages and four DP ranks on one DGX A100, ``microbatches`` of one sequence."""
    config = LlamaConfig(num_layers=4, hidden_size=1024, num_heads=16, num_kv_heads=4,
                         ffn_hidden_size=2816, vocab_size=4096)
    problem = make_problem(load_model(_llama_module(config)), load_cluster(selene(DP)),
                           training_spec(S, 4 * microbatches, "bf16", "fsdp", "flash"),
                           runtime_settings={"zero3_overlap": 0.0})
    plan = plan_from_pins(problem, Pins(tp=1, pp=2, dp=4, mbs=1, zero=3))
    layers = problem.graph.layers
    stage_params = max(sum(layer.num_params for layer in
                           layers[stage.first_layer:stage.first_layer + stage.num_layers])
                       for stage in plan.stages)
    return estimate(problem, plan).time_breakdown_s["dp_comm"], stage_params


def test_fsdp2_under_pipelining_gathers_and_reduces_a_stage_once_a_step():
    # torchtitan shards with reshard_after_forward=False under PP, and torch's pipelining
    # turns gradient sync off until the last micro-batch's backward: one all-gather and one
    # reduce-scatter a step, however many micro-batches. What each further micro-batch adds is
    # FSDP2's unsharded_accumulated_grad += grad (fp32 accumulator read and written, the bf16
    # gradient read: 10 bytes per parameter) through A100-80GB's HBM, nothing else.
    two, params = _pipelined_dp_comm(2)
    eight, _ = _pipelined_dp_comm(8)
    rate = 2.039e12 * compute_profile("a100-sxm4-80gb").memory_efficiency
    assert eight - two == pytest.approx(6 * 10 * params / rate, rel=1e-6)


def test_resident_fsdp2_copies_per_parameter_follow_its_code():
    # gathered: the all-gather copy-out (read 2, write 2). Trained, fp32 reduction over 32
    # micro-batches: the first gradient cast to fp32 (2 + 4), 31 accumulations (4 + 2 + 4), the
    # reduce-scatter copy-in of the fp32 accumulator (4 + 4) = 6 + 310 + 8.
    assert sync.resident_copy_bytes(4, 32) == (4, 324)
    # bf16 reduction (reduce_dtype = the parameters' dtype): no cast, AccumulateGrad's bf16
    # adds (2 + 2 + 2) and a bf16 copy-in (2 + 2).
    assert sync.resident_copy_bytes(2, 4) == (4, 3 * 6 + 4)


def test_torch_pipelining_that_returns_outputs_keeps_every_micro_batchs_logits():
    # torch's pipelining (stage.py: ``if self.is_last: self.output_chunks.append(output)``)
    # holds each micro-batch's last-stage output until the step ends, where the caller lets the
    # schedule return them (torch of late 2024; torchtitan 0.3 passes return_outputs=False):
    # beside the micro-batch it works on, 3 earlier micro-batches' bf16 logits of
    # 256 tokens x 32768 vocab on the last stage.
    module = _llama_module(LlamaConfig(num_layers=2, hidden_size=256, num_heads=8,
                                       num_kv_heads=2, ffn_hidden_size=896, vocab_size=32768))

    def activations(keeps: bool) -> float:
        problem = make_problem(load_model(module), load_cluster(selene(DP)),
                               training_spec(S, 4 * 4, "bf16", "fsdp", "flash"),
                               runtime_settings={"pp_keeps_last_outputs": keeps})
        plan = plan_from_pins(problem, Pins(tp=1, pp=2, dp=4, mbs=1, zero=3))
        return estimate(problem, plan).memory_breakdown_gib["activations"]

    assert (activations(True) - activations(False)) * 2**30 == pytest.approx(
        3 * S * 32768 * 2, rel=1e-9)
