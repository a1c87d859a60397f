"""Reference architectures the bundled example model.py files instantiate with published
configurations (GPT-3, MT-NLG, BLOOM, Llama 2). Plain PyTorch, written the way users write theirs."""

from autoplan.zoo.gpt import GPT, GPTConfig
from autoplan.zoo.llama import Llama, LlamaConfig
from autoplan.zoo.losses import next_token_loss

__all__ = ["GPT", "GPTConfig", "Llama", "LlamaConfig", "next_token_loss"]
