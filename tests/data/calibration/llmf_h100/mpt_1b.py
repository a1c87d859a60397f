"""MPT-1b as in llm-foundry's scripts/train/yamls/pretrain/mpt-1b.yaml (rows
LLMF-H100-33, LLMF-H100-34, LLMF-H100-35, LLMF-H100-36, LLMF-H100-37, LLMF-H100-38, LLMF-H100-39, LLMF-H100-40, LLMF-H100-41, LLMF-H100-42, LLMF-H100-43 of shared/data/more_runs.csv): 24 layers,
d_model 2048, 16 heads, MLP 8192, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=24, hidden_size=2048, num_heads=16, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=8192, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
