"""A GPT decoder in the style of nanoGPT (learned positions, pre-LayerNorm, GeLU MLP of 4h).

ALiBi (BLOOM) replaces the position table by a per-head bias on the attention scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int = 51200
    max_seq_len: int = 2048
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    dropout: float = 0.1
    alibi: bool = False
    tie_embeddings: bool = True


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)
        q, k, v = (t.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout,
                                           is_causal=bias is None)
        y = y.transpose(1, 2).contiguous().view(b, s, h)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        ffn = cfg.ffn_hidden_size or 4 * cfg.hidden_size
        self.c_fc = nn.Linear(cfg.hidden_size, ffn)
        self.c_proj = nn.Linear(ffn, cfg.hidden_size)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), bias)
        return x + self.mlp(self.ln_2(x))


def alibi_bias(num_heads: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """Causal ALiBi bias [1, heads, s, s] (Press et al. 2022), with -inf above the diagonal."""
    slopes = torch.tensor([2 ** (-8 * (i + 1) / num_heads) for i in range(num_heads)], device=device)
    pos = torch.arange(seq_len, device=device)
    distance = (pos[None, :] - pos[:, None]).float()
    causal = torch.full((seq_len, seq_len), float("-inf"), device=device).triu(1)
    return (slopes[:, None, None] * distance + causal)[None]


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = None if cfg.alibi else nn.Embedding(cfg.max_seq_len, cfg.hidden_size)
        self.emb_ln = nn.LayerNorm(cfg.hidden_size) if cfg.alibi else None  # BLOOM's embed norm
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, s = idx.shape
        x = self.wte(idx)
        bias = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(s, device=idx.device))
        else:
            x = self.emb_ln(x)
            bias = alibi_bias(self.cfg.num_heads, s, idx.device).to(x.dtype)
        x = self.drop(x)
        for block in self.h:
            x = block(x, bias)
        return self.lm_head(self.ln_f(x))

