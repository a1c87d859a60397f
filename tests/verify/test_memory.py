"""The memory of a verification run: the measurement replays allocator records correctly, and
the runtime's own buffers are predicted as worked out by hand."""

import torch

from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
from autoplan.verify.memory import PeakMemory, peak_of_records, pipeline_buffer_bytes
from tests.verify.cases import SEQ_LEN, model_path, plan_of


def test_peak_of_allocations_in_time_order():
    # +100 at a, +50 at b, a freed, +30 at c: peak 150 while a and b were live
    records = [(1, 100, 0xA), (2, 50, 0xB), (3, -100, 0xA), (4, 30, 0xC)]
    assert peak_of_records(records) == 150


def test_a_reused_block_whose_free_shows_late_is_counted_once():
    """Block a (100 B) is freed on one thread and its address handed to a 60 B block on another;
    the free's record carries a later time. Live at most: a (100) then b (60) + 40 = 100."""
    records = [(1, 100, 0xA), (2, 60, 0xA), (3, -100, 0xA), (4, 40, 0xB), (5, -60, 0xA)]
    assert peak_of_records(records) == 100


def test_frees_of_blocks_from_before_profiling_are_ignored():
    records = [(1, -500, 0xF), (2, 100, 0xA)]
    assert peak_of_records(records) == 100


def test_measured_peak_of_plain_tensors():
    """Real torch: 4000 B and 8000 B live together, then 2000 B after the first is freed."""
    class NoModel:
        stages = []
    with PeakMemory(NoModel()) as memory:
        a = torch.ones(1000)
        b = torch.ones(2000)
        del a
        c = torch.ones(500)
    del b, c
    assert memory.peak_bytes == 12000


def test_pipeline_buffers_by_hand():
    """tiny_llama_gqa (hidden 64, vocab 256, seq 32, fp32) in PP4 with two chunks per rank, one
    micro-batch of one sample, four micro-batches. Rank 3 runs stage 3 (block 2) and stage 7
    (the loss): it receives block 1's output (32*64*4 = 8192 B) and the logits
    (32*256*4 = 32768 B), and the gradient of block 2's output (8192 B), each for 4
    micro-batches: 4 * 49152. Rank 0 runs stage 0 (the embedding, which receives nothing) and
    stage 4 (block 3): the gradients of both outputs (8192 B each) and block 2's output. The
    interleaved schedule also keeps what it sent (the same sizes) until the step ends: x 2."""
    source = load_model_source(model_path("tiny_llama_gqa"))

    class Problem:
        graph = trace_model(source, seq_len=SEQ_LEN, precision="fp32")
    plan = plan_of("pp4_interleaved")
    assert pipeline_buffer_bytes(Problem, plan, 3) == 2 * 4 * (8192 + 32768 + 8192)
    assert pipeline_buffer_bytes(Problem, plan, 0) == 2 * 4 * (8192 + 8192 + 8192)
