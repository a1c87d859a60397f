"""A tiny GPT (4 layers, hidden 128) for tests and quick experiments."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=4, hidden_size=128, num_heads=4, vocab_size=1024, max_seq_len=256)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
