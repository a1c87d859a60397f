"""Llama 3.1 405B (Dubey et al. 2024): 126 layers, hidden 16384, 128 heads with 8 KV heads,
SwiGLU 53248, vocabulary 128256, rope theta 500000, sequence 8192."""

from autoplan.zoo import Llama, LlamaConfig, next_token_loss

CONFIG = LlamaConfig(num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8,
                     ffn_hidden_size=53248, vocab_size=128256, rope_theta=500000.0)


def build_model():
    return Llama(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
