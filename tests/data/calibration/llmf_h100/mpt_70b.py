"""MPT-70b as in llm-foundry's scripts/train/yamls/pretrain/mpt-70b.yaml (rows
LLMF-H100-01, LLMF-H100-02 of shared/data/more_runs.csv): 80 layers,
d_model 8192, 64 heads, MLP 32768, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=80, hidden_size=8192, num_heads=64, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=32768, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
