"""A tiny GPT (tied embeddings, fused QKV) for verification tests."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=4, hidden_size=64, num_heads=4, vocab_size=256, max_seq_len=64)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
