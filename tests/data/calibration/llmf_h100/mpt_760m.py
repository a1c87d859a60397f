"""MPT-760m as in llm-foundry's scripts/train/yamls/pretrain/mpt-760m.yaml (rows
LLMF-H100-44, LLMF-H100-45, LLMF-H100-46, LLMF-H100-47, LLMF-H100-48, LLMF-H100-49, LLMF-H100-50, LLMF-H100-51, LLMF-H100-52 of shared/data/more_runs.csv): 24 layers,
d_model 1536, 12 heads, MLP 6144, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=24, hidden_size=1536, num_heads=12, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=6144, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
