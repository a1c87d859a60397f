"""A tiny Llama with grouped-query attention (4 heads, 2 KV heads) for verification tests."""

from autoplan.zoo import Llama, LlamaConfig, next_token_loss

CONFIG = LlamaConfig(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2,
                     ffn_hidden_size=128, vocab_size=256)


def build_model():
    return Llama(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
