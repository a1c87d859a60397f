"""MPT-30b as in llm-foundry's scripts/train/yamls/pretrain/mpt-30b.yaml (rows
LLMF-H100-03, LLMF-H100-04, LLMF-H100-05, LLMF-H100-06, LLMF-H100-07, LLMF-H100-08 of shared/data/more_runs.csv): 48 layers,
d_model 7168, 56 heads, MLP 28672, vocabulary 50368, ALiBi, tied embeddings.
Built with the zoo GPT (its Linears carry biases; MPT's do not: about 0.1% more parameters)."""

from autoplan.zoo import GPT, GPTConfig, next_token_loss

CONFIG = GPTConfig(num_layers=48, hidden_size=7168, num_heads=56, vocab_size=50368,
                   max_seq_len=65536, ffn_hidden_size=28672, dropout=0.0, alibi=True,
                   tie_embeddings=True)


def build_model():
    return GPT(CONFIG)


def loss(output, inputs):
    return next_token_loss(output, inputs)
