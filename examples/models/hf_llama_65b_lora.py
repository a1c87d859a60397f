"""LoRA fine-tune of LLaMA 65B (Touvron et al. 2023: 80 layers, hidden 8192, 64 heads, SwiGLU
22016; Hugging Face transformers + peft from a config, no download), rank 16 on every Linear
of the blocks. With ``--frozen-dtype nf4 --optimizer adamw8bit --recompute full`` this is
QLoRA's 65B fine-tune on one 48 GB GPU (Dettmers et al. 2023)."""

from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = LlamaConfig(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64,
                     num_key_value_heads=64, intermediate_size=22016, vocab_size=32000,
                     max_position_embeddings=2048)
LORA = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                  task_type="CAUSAL_LM")


def build_model():
    return get_peft_model(LlamaForCausalLM(CONFIG), LORA)
