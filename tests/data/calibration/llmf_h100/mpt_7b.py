"""MPT-7b as in llm-foundry's scripts/train/yamls/pretrain/mpt-7b.yaml (rows
LLMF-H100-17, LLMF-H100-18, LLMF-H100-19, LLMF-H100-20, LLMF-H100-21, LLMF-H100-22 of shared/data/more_runs.csv): 32 layers,
d_model 4096, 32 heads, MLP 16384, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=32, hidden_size=4096, num_heads=32, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=16384, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
