"""What DeepSpeed runs once per step after the micro-batches: its ZeRO-1/2 optimizer (and
BF16_Optimizer) reduce the gradients with an all-reduce per bucket, each rank keeping its
partition, then all-gather the updated 16-bit partitions. Expected values: DeepSpeed's own
config default (installed package) and the ring algebra of the collectives worked by hand."""

from __future__ import annotations

import pytest

import autoplan
from autoplan.costmodels.profiles import runtime_profile
from autoplan.zoo import Llama, LlamaConfig, next_token_loss
from tests.graph.models import model_file

zero_config = pytest.importorskip("deepspeed.runtime.zero.config")

SEQ = 512
WIDE = LlamaConfig(num_layers=4, hidden_size=2048, num_heads=16, num_kv_heads=16,
                   ffn_hidden_size=5504, vocab_size=32000)
wide = model_file("wide_llama", lambda: Llama(WIDE), loss=next_token_loss)
"""About 0.33 B parameters: 0.65 GB of 16-bit gradients, so the collectives over 8 GPUs are
priced by their bandwidth, their latency a small part."""


def test_the_profile_states_deepspeeds_default():
    """DeepSpeedZeroConfig's default use_multi_rank_bucket_allreduce is what the deepspeed
    profile prices: every bucket all-reduced (stage_1_and_2.average_tensor)."""
    default = zero_config.DeepSpeedZeroConfig().use_multi_rank_bucket_allreduce
    assert runtime_profile("deepspeed").zero_grads_all_reduced is default is True


def _dp_comm(examples, **settings) -> float:
    pins = {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "zero": 1, "recompute": "none"}
    result = autoplan.estimate(wide, examples / "clusters" / "dgx-a100-x1.yaml", pins,
                               seq_len=SEQ, global_batch=8, runtime="deepspeed",
                               runtime_settings=settings or None)
    return result.estimate.time_breakdown_s["dp_comm"]


def test_all_reduced_gradients_cost_half_again_the_reduce_scatter_step(examples):
    """ZeRO-1 over 8 GPUs of one node, nothing overlapped (dp_overlap 0). A ring
    reduce-scatter and a ring all-gather of S bytes each send (n-1)/n S per rank, an all-reduce
    2 (n-1)/n S: DeepSpeed's all-reduce + all-gather moves 3 units where reduce-scatter +
    all-gather moves 2, so its exposed reduction is 3/2 of the other's (within 5%: latency
    and message-size terms are not in the volume count)."""
    deepspeed = _dp_comm(examples)
    reduce_scatter = _dp_comm(examples, zero_grads_all_reduced=False)
    assert deepspeed == pytest.approx(1.5 * reduce_scatter, rel=0.05)
