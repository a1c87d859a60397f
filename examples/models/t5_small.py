"""T5-small (Raffel et al. 2020) from transformers' config defaults: an encoder and a decoder
stack of 6 blocks each, d_model 512, 8 heads, d_ff 2048, vocabulary 32128. Encoder and decoder
see the same sequence length."""

import torch
from transformers import T5Config, T5ForConditionalGeneration


def build_model():
    return T5ForConditionalGeneration(T5Config())


def example_inputs(batch_size, seq_len):
    tokens = torch.zeros(batch_size, seq_len, dtype=torch.long)
    return {"input_ids": tokens, "decoder_input_ids": tokens}
