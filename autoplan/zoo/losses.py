"""The language-modelling loss the examples use."""

import torch
import torch.nn.functional as F


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32 (as Megatron computes it) against the inputs shifted by one."""
    targets = torch.roll(tokens, shifts=-1, dims=1)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
