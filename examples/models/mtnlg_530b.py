"""Megatron-Turing NLG 530B (Smith et al. 2022): 105 layers, hidden 20480, 128 heads; vocabulary
51200, sequence 2048."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=105, hidden_size=20480, num_heads=128, vocab_size=51200, max_seq_len=2048)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
