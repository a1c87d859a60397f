"""A tiny Mixtral (Hugging Face transformers, built from a config, no download): 8 experts,
top-2 routing, grouped-query attention. Traced with balanced routing (autoplan/graph/moe.py)."""

from transformers import MixtralConfig, MixtralForCausalLM

CONFIG = MixtralConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=8,
                       num_key_value_heads=2, intermediate_size=256, vocab_size=1024,
                       num_local_experts=8, num_experts_per_tok=2)


def build_model():
    return MixtralForCausalLM(CONFIG)
