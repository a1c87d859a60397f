"""BLOOM 176B (BigScience 2022): 70 layers, hidden 14336, 112 heads, ALiBi positions, LayerNorm
after the embedding, vocabulary 250880, sequence 2048."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=70, hidden_size=14336, num_heads=112, vocab_size=250880,
                   max_seq_len=2048, alibi=True, dropout=0.0)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
