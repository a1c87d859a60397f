"""DeepSpeed's PipelineEngine as it runs: the blocking transfers its TrainSchedule puts on each
stage's stream, the step they give, and the gradient accumulation its optimizers run after
each micro-batch. Expected values come from DeepSpeed's own schedule classes (instantiated on
CPU), an event simulation of their instruction streams written here, real torch on CPU, and
hand counts of DeepSpeed's source."""

from __future__ import annotations

from unittest import mock

import pytest

from autoplan.api import load_cluster, load_model
from autoplan.problems import make_problem, training_spec
from autoplan.search.defaults import plan_from_pins
from autoplan.cluster.catalog import get_gpu
from autoplan.costmodels.pipeline import blocking_transfers, pipeline_time
from autoplan.costmodels.profiles import compute_profile
from autoplan.costmodels.step import estimate
from autoplan.training import Pins
from tests.costmodels.test_deepspeed_memory import BATCH, SEQ, WIDE_VOCAB, wide_vocab

schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")

TRANSFERS = {"SendActivation": ("act", 1), "RecvActivation": ("act", -1),
             "SendGrad": ("grad", -1), "RecvGrad": ("grad", 1)}
"""Each TrainSchedule p2p instruction: what it moves and the stage it talks to (+1: next)."""


def _streams(stages: int, micro_batches: int) -> list[list[str]]:
    return [[type(cmd).__name__ for step in schedule.TrainSchedule(
        micro_batches=micro_batches, stages=stages, stage_id=s).steps() for cmd in step]
        for s in range(stages)]


def _simulate(forward: list[float], backward: list[float], transfer: float, m: int) -> float:
    """Makespan of DeepSpeed's TrainSchedule when every stage runs its instruction stream in
    order, computes take their time, and each send and its receive block both stages until
    both have posted it and the transfer is done (p2p.send/recv without async_op)."""
    p = len(forward)
    streams, clock, pc = _streams(p, m), [0.0] * p, [0] * p
    posted: dict[tuple, tuple[int, float]] = {}
    count: dict[tuple, int] = {}
    progressed = True
    while progressed:
        progressed = False
        for s in range(p):
            while pc[s] < len(streams[s]):
                name = streams[s][pc[s]]
                if name in ("ForwardPass", "BackwardPass"):
                    clock[s] += (forward if name == "ForwardPass" else backward)[s]
                elif name in TRANSFERS:
                    kind, peer = TRANSFERS[name]
                    pair = (kind, min(s, s + peer))
                    key = pair + (count.get((pair, s), 0),)
                    if key not in posted:
                        posted[key] = (s, clock[s])
                        break  # blocked until the peer posts the matching call
                    if posted[key][0] == s:
                        break
                    other, at = posted.pop(key)
                    clock[s] = clock[other] = max(at, clock[s]) + transfer
                    for rank in (s, other):
                        count[(pair, rank)] = count.get((pair, rank), 0) + 1
                    pc[other] += 1
                pc[s] += 1
                progressed = True
    assert pc == [len(stream) for stream in streams]
    return max(clock)


@pytest.mark.parametrize("stages", [2, 4, 6])
def test_transfers_per_micro_batch_are_those_of_trainschedule(stages):
    """Counting the Send/Recv instructions of DeepSpeed's TrainSchedule for each stage over 8
    micro-batches: 4 per micro-batch on a middle stage, 2 on the first and last."""
    m = 8
    for s, stream in enumerate(_streams(stages, m)):
        sent = sum(name in TRANSFERS for name in stream)
        assert sent == m * blocking_transfers(has_prev=s > 0, has_next=s < stages - 1,
                                              batched=False)


def _step(forward: list[float], backward: list[float], transfer: float, m: int,
          batched: bool) -> float:
    """The 1F1B step with each rank's micro-batch time carrying its blocking transfers."""
    p = len(forward)
    times = [f + b + transfer * blocking_transfers(has_prev=s > 0, has_next=s < p - 1,
                                                   batched=batched)
             for s, (f, b) in enumerate(zip(forward, backward))]
    return pipeline_time(slowest_s=max(times), total_s=sum(times), num_microbatches=m, vpp=1)


@pytest.mark.parametrize("stages,m", [(4, 32), (6, 48), (12, 128)])
def test_middle_stages_pay_four_transfers_per_micro_batch(stages, m):
    """Equal stages (F = 1, B = 3) and transfers of half a forward: the step of the simulated
    instruction streams is the 1F1B step with four transfers per micro-batch on the middle
    ranks and two on the first and last (within 2% with m >= 8p: the simulation adds about
    4 transfers per micro-batch in the steady state and fewer than the model's 4p - 8 in the
    fill and drain); two on every rank (batched exchanges, as Megatron-LM's schedule has
    them) is more than 5% short."""
    forward, backward, x = [1.0] * stages, [3.0] * stages, 0.5
    simulated = _simulate(forward, backward, x, m)
    assert _step(forward, backward, x, m, batched=False) == pytest.approx(simulated, rel=0.02)
    assert _step(forward, backward, x, m, batched=True) < 0.95 * simulated


@pytest.mark.parametrize("stages,m", [(4, 32), (12, 128)])
def test_a_heavier_last_stage_sets_the_step(stages, m):
    """The last stage (logits and loss) 50% heavier, with its two transfers: the middle ranks'
    extra transfers hide in their slack and the step is the slowest rank's, within 2% of the
    simulation."""
    forward, backward, x = [1.0] * stages, [3.0] * stages, 0.2
    forward[-1], backward[-1] = 1.5, 4.5
    simulated = _simulate(forward, backward, x, m)
    assert _step(forward, backward, x, m, batched=False) == pytest.approx(simulated, rel=0.02)


def test_equal_stages_without_transfers_take_the_1f1b_step():
    """Zero-cost transfers and equal stages: DeepSpeed's schedule takes (m + p - 1)(F + B),
    the 1F1B step (Narayanan et al. 2021): 4 stages, 8 micro-batches, F = 1, B = 2: 33."""
    assert _simulate([1.0] * 4, [2.0] * 4, 0.0, 8) == pytest.approx(33.0)


def _model():
    import torch
    from autoplan.zoo import Llama
    with torch.device("meta"):
        return Llama(WIDE_VOCAB)


def _params() -> int:
    """Parameters of the test model counted by real torch."""
    return sum(p.numel() for p in _model().parameters())


def _hbm_rate() -> float:
    gpu = get_gpu("a100-sxm4-80gb")
    return gpu.memory_bandwidth_Bps * compute_profile("a100-sxm4-80gb").memory_efficiency


@pytest.fixture(scope="module")
def traced():
    """The test model traced once for the module."""
    return load_model(wide_vocab)


def _estimate(examples, traced, cluster: str, pins: dict, precision: str, **settings):
    problem = make_problem(traced, load_cluster(examples / "clusters" / cluster),
                           training_spec(SEQ, BATCH, precision, "deepspeed", "flash"),
                           runtime_settings=settings or None)
    return estimate(problem, plan_from_pins(problem, Pins(**pins)))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gradient_accumulation_pass_per_micro_batch(examples, traced, precision):
    """One A100, ZeRO-1, 8 micro-batches of 1: autograd's AccumulateGrad adds each
    micro-batch's 16-bit gradient into the existing .grad in place (2 + 2 bytes read, 2
    written per parameter). The step differs by 8 x params x 6 / (HBM bandwidth x streaming
    efficiency) from the same run without the pass."""
    pins = {"dp": 1, "zero": 1, "mbs": 1, "recompute": "none"}
    expected = BATCH * _params() * 6 / _hbm_rate()
    with_pass = _estimate(examples, traced, "a100-x1.yaml", pins, precision)
    without = _estimate(examples, traced, "a100-x1.yaml", pins, precision,
                        grad_accumulation_bytes=0)
    assert with_pass.step_time_s - without.step_time_s == pytest.approx(expected, rel=1e-6)


def _deepspeed_wrapper(precision: str, zero: int, pp: int) -> str:
    """The optimizer wrapper DeepSpeed's own engine picks (DeepSpeedEngine.
    _do_optimizer_sanity_check, called on a stand-in engine with the default grad_accum_dtype,
    which get_data_types makes the model dtype)."""
    import torch
    from types import SimpleNamespace
    from deepspeed.runtime.engine import DeepSpeedEngine
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    engine = SimpleNamespace(
        get_data_types=lambda: (dtype, dtype), zero_optimization=lambda: zero > 0,
        zero_optimization_stage=lambda: zero, zero_cpu_offload=lambda: False,
        zero_compute_grad_norm=lambda: True, zero_allow_untested_optimizer=lambda: True,
        global_rank=1, pipeline_parallelism=pp > 1)
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])  # a ZeRO-supported optimizer
    with mock.patch("deepspeed.comm.get_rank", return_value=1):  # no process group on CPU
        return str(DeepSpeedEngine._do_optimizer_sanity_check(engine, adam))


@pytest.mark.parametrize("precision,zero,pp", [("bf16", 0, 2), ("bf16", 1, 2), ("fp16", 0, 2),
                                               ("bf16", 1, 1)])
def test_bf16_optimizer_pass_where_deepspeed_picks_it(examples, traced, precision, zero, pp):
    """BF16_Optimizer updates fp32 gradients each micro-batch: clear_lp_grads writes 2 bytes,
    AccumulateGrad adds into the zeroed .grad (6) and update_hp_grads casts to fp32 (2 read,
    4 written) and adds (4 + 4 read, 4 written): 26 bytes per parameter. It is priced exactly
    where DeepSpeed's engine picks that wrapper, the plain 6-byte accumulation elsewhere."""
    pins = {"pp": pp, "dp": 1, "zero": zero, "mbs": 1, "recompute": "none"}

    def compute(**settings) -> float:
        return _estimate(examples, traced, "dgx-a100-x1.yaml", pins, precision,
                         **settings).time_breakdown_s["compute"]

    bf16_pass = compute() - compute(bf16_optimizer_accumulation_bytes=0)
    plain_pass = compute(bf16_optimizer_accumulation_bytes=0) - compute(
        bf16_optimizer_accumulation_bytes=0, grad_accumulation_bytes=0)
    if _deepspeed_wrapper(precision, zero, pp) == "bf16":  # deepspeed's BFLOAT16 constant
        assert plain_pass == 0.0
        assert bf16_pass > 0.0
    else:
        assert bf16_pass == 0.0
        assert plain_pass > 0.0


def test_a_slowest_first_stage_overlaps_the_downstream_round_trip():
    """The closed form (m - 1) max t + sum t is exact when the slowest stage is the last and an
    upper bound otherwise: a slowest first stage runs its p - 1 warm-up forwards while
    micro-batch 0 goes down the other stages and back. 4 stages, 8 micro-batches, the first at
    F = 1.5, B = 4 and the others at 1 and 3: the first stage works 8 x 5.5 = 44 s and waits
    once for the round trip, 1.5 + 3 x (1 + 3) - 4 x 1.5 = 7.5 s: 51.5 s, where the form gives
    7 x 5.5 + 5.5 + 3 x 4 = 56 s."""
    forward, backward = [1.5, 1.0, 1.0, 1.0], [4.0, 3.0, 3.0, 3.0]
    assert _simulate(forward, backward, 0.0, 8) == pytest.approx(51.5)
    assert _step(forward, backward, 0.0, 8, batched=False) == pytest.approx(56.0)
