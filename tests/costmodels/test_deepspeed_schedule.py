"""The pipeline model against DeepSpeed's own PipelineEngine schedule, replayed.

deepspeed.runtime.pipe.schedule.TrainSchedule gives every stage its instruction stream
(RecvActivation, ForwardPass, SendGrad, RecvGrad, BackwardPass, SendActivation, ...). The
replay below runs those streams as the engine does: each stage executes its instructions in
order, a forward or backward takes its stage's time, and each send meets its receive (the
engine's blocking p2p.send / p2p.recv: both sides wait for the other, then both spend the
transfer time). Nothing of autoplan is used to get the times, so they check
costmodels.pipeline's closed forms: the 1F1B step (m - 1) max t + sum t, and the blocking
transfers a stage puts on its stream per micro-batch.
"""

import pytest

from autoplan.costmodels.pipeline import blocking_transfers, pipeline_time

schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")

PEERS = {"SendActivation": (1, "act", True), "RecvActivation": (-1, "act", False),
         "SendGrad": (-1, "grad", True), "RecvGrad": (1, "grad", False)}


def _streams(micro_batches: int, stages: int) -> list[list[str]]:
    return [[type(cmd).__name__ for step in schedule.TrainSchedule(
        micro_batches=micro_batches, stages=stages, stage_id=stage).steps() for cmd in step]
        for stage in range(stages)]


def replay(micro_batches: int, forward_s: list[float], backward_s: list[float],
           transfer_s: float = 0.0) -> float:
    """Seconds until every stage has run its last instruction."""
    stages = len(forward_s)
    streams = _streams(micro_batches, stages)
    clock, at = [0.0] * stages, [0] * stages
    posted: dict[tuple, dict[bool, float]] = {}
    count: dict[tuple, int] = {}
    while any(at[k] < len(streams[k]) for k in range(stages)):
        moved = False
        for k in range(stages):
            while at[k] < len(streams[k]):
                name = streams[k][at[k]]
                if name in ("ForwardPass", "BackwardPass"):
                    clock[k] += (forward_s if name == "ForwardPass" else backward_s)[k]
                elif name in PEERS:
                    step, kind, sending = PEERS[name]
                    src, dst = (k, k + step) if sending else (k + step, k)
                    seq = count.get((src, dst, kind, sending), 0)
                    sides = posted.setdefault((src, dst, kind, seq), {})
                    sides.setdefault(sending, clock[k])
                    if (not sending) not in sides:
                        break  # wait for the peer
                    clock[k] = max(sides.values()) + transfer_s
                    count[(src, dst, kind, sending)] = seq + 1
                at[k] += 1
                moved = True
        assert moved, "the replayed schedule deadlocked"
    return max(clock)


@pytest.mark.parametrize("micro_batches,stages", [(4, 2), (8, 4), (24, 8), (64, 35)])
def test_equal_stages_take_m_plus_p_minus_1_slots(micro_batches, stages):
    forward, backward = 1.0, 3.0  # full recompute: backward = recompute + 2 forwards
    replayed = replay(micro_batches, [forward] * stages, [backward] * stages)
    assert replayed == pytest.approx((micro_batches + stages - 1) * (forward + backward))
    assert pipeline_time(slowest_s=forward + backward, total_s=stages * (forward + backward),
                         num_microbatches=micro_batches, vpp=1) == pytest.approx(replayed)


def test_a_slowest_last_stage_sets_m_minus_1_slots_plus_the_fill():
    # the last stage with the head and loss: 1.5 + 4 s against 1 + 3 s for the others
    forward, backward = [1.0, 1.0, 1.0, 1.5], [3.0, 3.0, 3.0, 4.0]
    per_stage = [f + b for f, b in zip(forward, backward)]
    assert pipeline_time(slowest_s=max(per_stage), total_s=sum(per_stage), num_microbatches=8,
                         vpp=1) == pytest.approx(replay(8, forward, backward))  # 56 s


def test_a_slowest_first_stage_overlaps_the_downstream_drain():
    # The closed form is an upper bound when the slowest stage is not the last: the first
    # stage runs its warm-up forwards while micro-batch 0 goes down and back up the others.
    # Here the replay gives 8 x 5.5 + (1.5 + 12 - 4 x 1.5) = 51.5 s, the form 56 s.
    forward, backward = [1.5, 1.0, 1.0, 1.0], [4.0, 3.0, 3.0, 3.0]
    per_stage = [f + b for f, b in zip(forward, backward)]
    bound = pipeline_time(slowest_s=max(per_stage), total_s=sum(per_stage), num_microbatches=8,
                          vpp=1)
    assert replay(8, forward, backward) == pytest.approx(51.5)
    assert bound == pytest.approx(56.0)


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_each_blocking_transfer_adds_its_time_to_every_micro_batch(stages):
    # In the steady state a middle stage pays RecvActivation, SendGrad, RecvGrad and
    # SendActivation (4 transfers) per micro-batch, a pipeline of 2 only its ends' 2: the
    # slope of the step in the micro-batches is F + B + transfers x c.
    forward, backward, transfer = 1.0, 3.0, 0.25
    slope = (replay(40, [forward] * stages, [backward] * stages, transfer)
             - replay(20, [forward] * stages, [backward] * stages, transfer)) / 20
    middle = stages > 2
    transfers = blocking_transfers(has_prev=True, has_next=middle, batched=False)
    assert transfers == (4 if middle else 2)
    assert slope == pytest.approx(forward + backward + transfers * transfer)
