"""T5-small (Raffel et al. 2020) from transformers' config defaults: an encoder and a decoder
stack of 6 blocks each, d_model 512, 8 heads, d_ff 2048, vocabulary 32128. No example_inputs:
autoplan reads forward's signature and feeds input_ids and decoder_input_ids, both --seq-len
long."""

from transformers import T5Config, T5ForConditionalGeneration


def build_model():
    return T5ForConditionalGeneration(T5Config())
