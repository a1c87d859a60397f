"""Llama 2 7B (Touvron et al. 2023): 32 layers, hidden 4096, 32 heads (MHA), SwiGLU 11008,
vocabulary 32000, sequence 4096."""

from autoplan.zoo import Llama, LlamaConfig, next_token_loss

CONFIG = LlamaConfig(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                     ffn_hidden_size=11008)


def build_model():
    return Llama(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
