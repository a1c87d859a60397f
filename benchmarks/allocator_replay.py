"""What PyTorch's CUDA caching allocator would reserve for a real training step.

Records every allocation and free of a few steps of a small Llama on this CPU (torch.profiler,
as ``autoplan verify`` does), the stage holding ``in_flight`` micro-batches as a 1F1B first
stage does (warm-up forwards, then one backward and one forward in turn), with persistent
gradients (Megatron's main-grad buffer) and AdamW; then replays the last step's records
through the allocator's rules (costmodels/allocator.py) and prints the allocated and reserved
peaks and the reserved excess as a fraction of the step's dynamic memory (the peak over what
the model held when the step began), the quantity profiles.yaml's ``fragmentation`` states.

    .venv/bin/python benchmarks/allocator_replay.py
"""

from __future__ import annotations

import sys

import torch

from autoplan.costmodels.allocator import replay
from autoplan.verify.memory import allocation_records, peak_of_records
from autoplan.zoo import Llama, LlamaConfig, next_token_loss

SMALL = LlamaConfig(2, 512, 8, 8, 1408, vocab_size=8192)
CONFIGS = (  # (label, config, seq, mbs, in_flight); fp32 on CPU, so a [s, h] tensor of mbs 4
    # at s 1024, h 512 takes 8 MiB, as a bf16 one at h 1024 would on a GPU
    ("h512 s1024 mbs4, 1 in flight", SMALL, 1024, 4, 1),
    ("h512 s1024 mbs4, 3 in flight", SMALL, 1024, 4, 3),
    ("h1024 s2048 mbs1, 1 in flight", LlamaConfig(2, 1024, 8, 8, 2816, vocab_size=8192), 2048, 1,
     1),
)


def one_f_one_b(model, batches, in_flight: int) -> None:
    """Forward ``in_flight`` micro-batches, then alternate one backward and one forward."""
    pending = []
    for tokens in batches:
        pending.append(next_token_loss(model(tokens), tokens))
        if len(pending) == in_flight:
            pending.pop(0).backward()
    for loss in pending:
        loss.backward()


def measure(config: LlamaConfig, seq: int, mbs: int, in_flight: int) -> tuple[int, int, int]:
    """(held at the step's start, allocated peak, reserved peak) of the recorded step."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = Llama(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    batches = [torch.randint(0, config.vocab_size, (mbs, seq)) for _ in range(in_flight + 2)]
    for step in range(2):  # the first step creates the gradients and Adam's moments
        if step == 1:
            held = sum(t.untyped_storage().nbytes() for t in model.parameters())
            held += sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
            held += sum(v.untyped_storage().nbytes() for s in optimizer.state.values()
                        for v in s.values() if torch.is_tensor(v) and v.dim())
            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            prof.__enter__()
        one_f_one_b(model, batches, in_flight)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    prof.__exit__(None, None, None)
    records = allocation_records(prof)
    allocator = replay(records)
    return held, held + peak_of_records(records), held + allocator.peak_reserved


def main() -> int:
    print(f"{'config':30} {'held':>8} {'allocated':>10} {'reserved':>9} {'excess/dynamic':>15}")
    for label, config, seq, mbs, in_flight in CONFIGS:
        held, allocated, reserved = measure(config, seq, mbs, in_flight)
        mib = 2**20
        print(f"{label:30} {held / mib:8.0f} {allocated / mib:10.0f} {reserved / mib:9.0f} "
              f"{(reserved - allocated) / (allocated - held):15.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
