"""A stage's step replayed through the caching allocator (costmodels/step_allocations.py):
each case worked by hand from the allocator's rules (segments of the request rounded up to
2 MiB from 10 MiB on, best fit, a block serves only requests no larger than itself), and the
decomposition of a layer's bytes into the tensors it allocates."""

from __future__ import annotations

from autoplan.costmodels.step_allocations import (
    LayerTensors,
    StageOutput,
    replay_step,
    step_segments,
    tensors_of,
)

MIB = 2**20


def test_a_layers_bytes_become_its_own_tensors_then_hidden_states():
    """100 MiB with a 40 MiB and a 70 MiB tensor of its own and 16 MiB hidden states: the 70
    fits (30 left), the 40 does not; then one 16 MiB tensor and a 14 MiB rest."""
    assert tensors_of(100 * MIB, 16 * MIB, (40 * MIB, 70 * MIB)) == (70 * MIB, 16 * MIB,
                                                                      14 * MIB)
    assert tensors_of(0, 16 * MIB) == ()
    assert tensors_of(10 * MIB, 16 * MIB) == (10 * MIB,)


def test_kept_tensors_are_reused_micro_batch_after_micro_batch():
    """Two layers keep 20 MiB each and work with 30 MiB; one micro-batch in flight, 4 in the
    step (held + 2 = 3 replayed). First forward: two 20 MiB segments (40). Backward of layer 2: a 30 MiB segment (70
    reserved, 70 allocated at its peak); layer 1 reuses it. Later forwards take the cached 20
    MiB blocks (best fit, not the 30), so nothing grows: 70 reserved, 70 allocated at the
    peak, no excess."""
    layers = (LayerTensors((20 * MIB,), (30 * MIB,), 2),)
    replay = replay_step(layers, held=1, num_microbatches=4)
    assert (replay.backward_allocated, replay.backward_reserved) == (70 * MIB, 70 * MIB)
    assert replay.backward_excess == 0


def test_a_smaller_cached_block_never_serves_a_larger_request():
    """Layer kept 30 MiB, working 20 MiB, two micro-batches in flight, 4 in the step. Warm-up
    forward: a 30 MiB segment (A). Forward 2: B (30). Backward 1: working 20 MiB, a new
    segment C (80 reserved, 80 allocated), freed; A freed. Forward 3 takes A (the best fit
    for 30 is A, 30; C is too small). Backward 2: working takes C; then B freed. Forward 4
    takes B; backwards 3 and 4 take C. Peak allocated 80 = reserved 80: same sizes again,
    no excess; the 20 MiB block never serves a 30 MiB request."""
    layers = (LayerTensors((30 * MIB,), (20 * MIB,)),)
    replay = replay_step(layers, held=2, num_microbatches=4)
    assert (replay.backward_allocated, replay.backward_reserved) == (80 * MIB, 80 * MIB)


def test_a_step_transient_larger_than_every_cached_block_takes_a_new_segment():
    """After the backward (above: 70 MiB reserved in 20, 20 and 30 MiB segments, all free), a
    100 MiB flat copy fits no cached block: reserved 170, what nvidia-smi shows; a 30 MiB
    copy takes the cached 30 MiB block: still 70. On a full device the allocator first
    returns the three free segments: 100."""
    layers = (LayerTensors((20 * MIB,), (30 * MIB,), 2),)
    big = replay_step(layers, held=1, num_microbatches=4, step_transients=(100 * MIB,))
    assert (big.reserved, big.step_new_segments, big.step_allocated) == (
        170 * MIB, 100 * MIB, 100 * MIB)
    small = replay_step(layers, held=1, num_microbatches=4, step_transients=(30 * MIB,))
    assert small.step_new_segments == 0
    full = replay_step(layers, held=1, num_microbatches=4, step_transients=(100 * MIB,),
                       release_before_growing=True)
    assert full.reserved == 100 * MIB


def test_pipe_buffers_keep_the_last_outputs_past_their_backward():
    """A last stage with a 50 MiB output kept in 2 pipe buffers, one micro-batch in flight
    (held + 2 = 3 replayed), layer kept 20 working 30. Forward 1: 20 + 50 (70). Backward 1:
    30 (100), frees 30 and 20; the output stays. Forward 2: 20 (reused) and a second 50
    (150 reserved). Backward 2: the 30 again (150 allocated). Forward 3: 20, and the third
    output takes a new 50 before the first is dropped: 200 reserved, 170 allocated (20 kept
    and three outputs). At the step the two buffered outputs are still allocated; the step's
    own transient (10 MiB, split off the cached 20) counts alone and takes no segment."""
    layers = (LayerTensors((20 * MIB,), (30 * MIB,)),)
    replay = replay_step(layers, held=1, num_microbatches=4, step_transients=(10 * MIB,),
                         output=StageOutput(50 * MIB, slots=2))
    assert (replay.backward_reserved, replay.backward_allocated) == (200 * MIB, 170 * MIB)
    assert (replay.step_allocated, replay.step_new_segments) == (10 * MIB, 0)


CASES = (  # (layers, held, num_microbatches, step transients, pipe-buffer output)
    ((LayerTensors((20 * MIB,), (30 * MIB,), 2),), 1, 4, (100 * MIB,), None),
    ((LayerTensors((20 * MIB,), (30 * MIB,), 2),), 1, 4, (30 * MIB,), None),
    ((LayerTensors((20 * MIB,), (30 * MIB,)),), 1, 4, (10 * MIB,), StageOutput(50 * MIB, 2)),
    ((LayerTensors((20 * MIB,), (30 * MIB,)),), 1, 4, (120 * MIB,), StageOutput(50 * MIB, 2)),
    ((LayerTensors((3 * MIB, 40 * MIB), (70 * MIB, 5 * MIB, 5 * MIB), 3),
      LayerTensors((), (90 * MIB, 45 * MIB))), 3, 8, (80 * MIB, 200 * MIB, 150 * MIB),
     StageOutput(40 * MIB)),
)


def test_the_closed_form_finds_what_the_replay_finds_at_the_step():
    """step_segments against replay_step: the segments the step's transients add over the
    backward's reserved peak, and on a full device (free segments returned before growing)
    the step's high-water (the larger of the backward's and the transients'). Worked by hand for the first case: after the
    backward, free segments of 20, 20 and 30 MiB; the 100 MiB copy takes its own (100 new);
    on a full device the three are returned first (100)."""
    first = step_segments(CASES[0][0], num_microbatches=4, step_transients=(100 * MIB,))
    assert (first.new, first.least) == (100 * MIB, 100 * MIB)
    for layers, held, m, transients, output in CASES:
        segments = step_segments(layers, num_microbatches=m, step_transients=transients,
                                 output=output)
        cached = replay_step(layers, held=held, num_microbatches=m,
                             step_transients=transients, output=output)
        full = replay_step(layers, held=held, num_microbatches=m, step_transients=transients,
                           output=output, release_before_growing=True)
        assert segments.new == cached.step_new_segments
        # a transient a cached block serves needs no release: the step then stays within
        # the backward's peak, the larger of the two moments being what the stage needs
        assert (max(full.backward_reserved, segments.least)
                == max(full.backward_reserved, full.step_reserved))
