"""Llama 2 70B (Touvron et al. 2023): 80 layers, hidden 8192, 64 heads with 8 KV heads (GQA),
SwiGLU 28672, vocabulary 32000, sequence 4096."""

from autoplan.zoo import Llama, LlamaConfig, next_token_loss

CONFIG = LlamaConfig(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                     ffn_hidden_size=28672)


def build_model():
    return Llama(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
