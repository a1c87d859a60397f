"""GPT-3 175B (Brown et al. 2020): 96 layers, hidden 12288, 96 heads; vocabulary 51200, sequence 2048."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=96, hidden_size=12288, num_heads=96, vocab_size=51200, max_seq_len=2048)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
