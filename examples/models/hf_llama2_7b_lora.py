"""LoRA fine-tune of Llama 2 7B (Hugging Face transformers + peft, built from a config on the
meta device, no download): rank 16 on every Linear of the blocks ("all-linear", as QLoRA
does), the base frozen. autoplan prices the 40M trained parameters' gradients and optimizer
state, not the 6.7B frozen ones; add ``--frozen-dtype nf4`` for QLoRA's 4-bit base."""

from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = LlamaConfig(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                     max_position_embeddings=4096)
LORA = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                  task_type="CAUSAL_LM")


def build_model():
    return get_peft_model(LlamaForCausalLM(CONFIG), LORA)
