"""The cross-entropy's peak memory per logit, measured on real torch on CPU: a dispatch mode
counts the bytes of every storage an op allocates until it is freed, and the high-water mark
over forward and backward is compared with ``costmodels.memory.loss_peak_bytes``."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss as tensor_parallel_loss
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autoplan.costmodels.compute import Split
from autoplan.costmodels.memory import cross_entropy_bytes_per_logit, loss_peak_bytes
from autoplan.costmodels.profiles import runtime_profile

TOKENS, VOCAB = 256, 4096


class LiveBytes(TorchDispatchMode):
    """High-water mark of the bytes held by storages that ops create while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if type(t) is torch.Tensor:  # not a collective's wrapper (its storage is its own)
                self._track(t.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key = storage.data_ptr()
        if key in self.seen or not storage.nbytes():
            return
        self.seen.add(key)
        size = storage.nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self.seen.discard(key)
        self.live -= size


def _measured_peak(loss_of) -> int:
    """Peak bytes a loss over bf16 logits allocates in its forward and backward (the logits
    and the gradient left in their ``.grad`` not counted: they belong to the head)."""
    torch.manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, VOCAB, (TOKENS,))
    with LiveBytes() as mode:
        loss_of(logits, targets).backward()
    return mode.peak


def test_upcast_cross_entropy_peaks_at_12_bytes_per_logit():
    """``cross_entropy(logits.float())`` (torchtitan's and HF's loss): the saved fp32
    log-softmax, the dense fp32 gradient nll_loss's backward writes and log_softmax's
    backward output live together: 3 x 4 bytes per logit."""
    measured = _measured_peak(lambda x, y: F.cross_entropy(x.float(), y))
    predicted = loss_peak_bytes(TOKENS * VOCAB * 2, Split(tp=1, cp=1, sp=False, mbs=1),
                                bytes_per_logit=runtime_profile("fsdp").loss_bytes_per_logit)
    assert measured == pytest.approx(predicted, rel=0.01)


def test_fused_softmax_cross_entropy_peaks_at_6_bytes_per_logit():
    """Megatron's fused cross-entropy (tensor_parallel/cross_entropy.py, at TP 1): the fp32
    copy becomes the softmax in place and backward turns it into the gradient in place; with
    the 16-bit gradient handed back, 4 + 2 bytes per logit. Its forward/backward written as a
    torch.autograd.Function the way Megatron's is, run on real torch."""

    class FusedCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets):
            x = logits.float()
            x -= x.max(dim=-1, keepdim=True).values
            predicted = x.gather(-1, targets[:, None]).squeeze(-1)
            x.exp_()
            total = x.sum(dim=-1)
            x.div_(total[:, None])
            ctx.save_for_backward(x, targets)
            return (torch.log(total) - predicted).mean()

        @staticmethod
        def backward(ctx, grad):
            softmax, targets = ctx.saved_tensors
            softmax.scatter_add_(-1, targets[:, None],
                                 -torch.ones_like(targets[:, None], dtype=softmax.dtype))
            softmax.mul_(grad / softmax.shape[0])
            return softmax.to(torch.bfloat16), None

    measured = _measured_peak(FusedCrossEntropy.apply)
    predicted = loss_peak_bytes(TOKENS * VOCAB * 2, Split(tp=1, cp=1, sp=False, mbs=1),
                                bytes_per_logit=runtime_profile("megatron").loss_bytes_per_logit)
    assert measured == pytest.approx(predicted, rel=0.01)


@pytest.fixture
def one_rank_mesh(tmp_path):
    """A one-process gloo group and its device mesh on CPU (a file store: no port to share)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_loss_parallel_cross_entropy_peaks_at_16_bytes_per_logit(one_rank_mesh):
    """torchtitan with TP takes ``cross_entropy(logits.float())`` under torch's loss_parallel:
    DTensor runs its own log-softmax and nll-loss backward on each vocabulary shard. Those
    functions of torch (tensor/parallel/loss.py) run here on a shard as autograd calls them:
    the fp32 copy is the log-softmax's argument (freed after it), the log-softmax output is
    saved for backward and is the backward's input, and the fp32 gradient is cast back to
    the logits' bf16. Their high-water mark is the fsdp runtime's price with TP."""
    torch.manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16)
    targets = torch.randint(0, VOCAB, (TOKENS,))
    mesh_dim, mean, no_ignore = 0, 1, -100
    with LiveBytes() as mode:
        upcast = logits.float()
        log_probs = tensor_parallel_loss._log_softmax(upcast, 1, False, one_rank_mesh, mesh_dim)
        del upcast
        grad = tensor_parallel_loss._nll_loss_and_log_softmax_backward(
            torch.tensor(1.0), log_probs, targets, None, mean, no_ignore,
            torch.tensor(float(TOKENS)), log_probs.shape, 1, one_rank_mesh, mesh_dim)
        del log_probs
        grad.to(torch.bfloat16)
    fsdp = runtime_profile("fsdp")
    predicted = loss_peak_bytes(TOKENS * VOCAB * 2, Split(tp=1, cp=1, sp=False, mbs=1),
                                bytes_per_logit=cross_entropy_bytes_per_logit(fsdp, tp=2))
    assert mode.peak == pytest.approx(predicted, rel=0.01)
    assert cross_entropy_bytes_per_logit(fsdp, tp=1) == fsdp.loss_bytes_per_logit  # no TP


def test_loss_peak_splits_over_tp_and_cp_and_scales_with_the_micro_batch():
    # 12 bytes x (2048 tokens x 128256 vocab) x mbs 2 / (tp 4 x cp 2), by hand
    split = Split(tp=4, cp=2, sp=True, mbs=2)
    assert loss_peak_bytes(2048 * 128256 * 2, split, bytes_per_logit=12) == \
        12 * 2048 * 128256 * 2 / 8
