"""A 1T-parameter GPT (Narayanan et al. 2021, Table 1 last row): 128 layers, hidden 25600,
160 heads; vocabulary 51200, sequence 2048."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=128, hidden_size=25600, num_heads=160, vocab_size=51200,
                   max_seq_len=2048)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
