"""MPT-3b as in llm-foundry's scripts/train/yamls/pretrain/mpt-3b.yaml (rows
LLMF-H100-23, LLMF-H100-24, LLMF-H100-25, LLMF-H100-26, LLMF-H100-27, LLMF-H100-28, LLMF-H100-29, LLMF-H100-30, LLMF-H100-31, LLMF-H100-32 of shared/data/more_runs.csv): 32 layers,
d_model 2560, 20 heads, MLP 10240, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=32, hidden_size=2560, num_heads=20, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=10240, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
