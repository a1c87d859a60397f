"""Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts"; Hugging Face mistralai/Mixtral-8x7B-v0.1
config.json): 32 layers, hidden 4096, 32 heads with 8 KV heads, SwiGLU experts of 14336,
8 experts with top-2 routing, vocabulary 32000. Built from the config (no download)."""

from transformers import MixtralConfig, MixtralForCausalLM

CONFIG = MixtralConfig(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                       num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768)


def build_model():
    return MixtralForCausalLM(CONFIG)
