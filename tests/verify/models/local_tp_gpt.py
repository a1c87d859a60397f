"""A GPT block written for Megatron-style local TP shards: separate Q, K, V Linears and head
counts derived from the tensor."""

import torch.nn.functional as F
from torch import nn

from autoplan.zoo import next_token_loss

HIDDEN, HEADS, VOCAB, LAYERS = 64, 4, 256, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.q, self.k, self.v = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.o = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm(x)
        q, k, v = (f(h).view(b, s, -1, HIDDEN // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(y.transpose(1, 2).reshape(b, s, -1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return Model()


def loss(output, inputs):
    return next_token_loss(output, inputs)
