"""A tiny GPT whose forward raises on rank 1 of a parallel run (and nowhere else)."""

import torch.distributed as dist

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=4, hidden_size=64, num_heads=4, vocab_size=256, max_seq_len=64)


class FailsOnRank1(GPT):
    def forward(self, idx):
        if dist.is_initialized() and dist.get_rank() == 1:
            raise RuntimeError("rank 1 broke on purpose")
        return super().forward(idx)


def build_model():
    return FailsOnRank1(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
