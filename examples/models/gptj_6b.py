"""A 6B GPT (GPT-J 6B's shape: 28 layers, hidden 4096, 16 heads, MLP 16384, vocabulary 50400),
the size of the chat models people compare GPUs with for inference."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=28, hidden_size=4096, num_heads=16, vocab_size=50400,
                   max_seq_len=2048, tie_embeddings=False)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
