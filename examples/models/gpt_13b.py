"""A 13B GPT (GPT-3 13B's shape, Brown et al. 2020 Table 2.1: 40 layers, hidden 5120, 40 heads,
MLP 20480, vocabulary 50257 padded to 51200)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=40, hidden_size=5120, num_heads=40, vocab_size=51200,
                   max_seq_len=2048, tie_embeddings=False)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
