"""MPT-13b as in llm-foundry's scripts/train/yamls/pretrain/mpt-13b.yaml (rows
LLMF-H100-09, LLMF-H100-10, LLMF-H100-11, LLMF-H100-12, LLMF-H100-13, LLMF-H100-14, LLMF-H100-15, LLMF-H100-16 of shared/data/more_runs.csv): 40 layers,
d_model 5120, 40 heads, MLP 20480, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=40, hidden_size=5120, num_heads=40, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=20480, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
