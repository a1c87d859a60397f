"""A model.py with no ``example_inputs`` traces from forward's signature: T5 (encoder-decoder),
ViT (pixels) and Whisper (log-mel features) from tiny configs, every parameter seen; a forward
that needs an argument autoplan cannot build exits 2 saying to write example_inputs."""

from __future__ import annotations

import textwrap

import pytest
import torch
from typer.testing import CliRunner

from autoplan.api import load_model
from autoplan.cli import app
from autoplan.graph.inputs import default_inputs
from tests.extras import require
from tests.graph.models import model_file

T = require("transformers")

CASES = {
    "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128, vocab_size=256)),
    "vit": lambda: T.ViTForImageClassification(T.ViTConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_channels=1)),
    "whisper": lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=24, max_target_positions=32)),
}


def _on_meta(build):
    with torch.device("meta"):
        return build()


@pytest.mark.parametrize("name", sorted(CASES))
def test_traces_without_example_inputs_and_counts_every_parameter(name):
    graph = load_model(model_file(name, CASES[name])).trace(16)
    assert graph.num_params == sum(p.numel() for p in _on_meta(CASES[name]).parameters())


def test_inputs_take_their_shapes_from_the_config():
    with torch.device("meta"):
        t5 = default_inputs("t5", _on_meta(CASES["t5"]), 1, 16)
        vit = default_inputs("vit", _on_meta(CASES["vit"]), 1, 16)
        whisper = default_inputs("whisper", _on_meta(CASES["whisper"]), 1, 16)
    assert {k: tuple(v.shape) for k, v in t5.items()} == {"input_ids": (1, 16), "decoder_input_ids": (1, 16)}
    # ViT: [b, num_channels 1, image_size 32, 32]; --seq-len does not apply to an image.
    assert {k: tuple(v.shape) for k, v in vit.items()} == {"pixel_values": (1, 1, 32, 32)}
    # Whisper: [b, num_mel_bins 16, 2 x max_source_positions 24 = 48 frames] and 16 decoder tokens.
    assert {k: tuple(v.shape) for k, v in whisper.items()} == {
        "input_features": (1, 16, 48), "decoder_input_ids": (1, 16)}


def test_a_decoder_only_model_still_gets_plain_token_ids():
    llama = _on_meta(lambda: T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64)))
    with torch.device("meta"):
        inputs = default_inputs("llama", llama, 1, 8)
    assert isinstance(inputs, torch.Tensor) and tuple(inputs.shape) == (1, 8)


HEADER = "import torch\nfrom torch import nn\n"
BAD = {
    "second_required": ("""
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(16, 8)
            def forward(self, tokens, mask):
                return self.emb(tokens) * mask
        def build_model():
            return M()
        """, ["'mask'", "example_inputs"]),
    "unknown_keyword": ("""
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)
            def forward(self, images=None, boxes=None):
                return self.proj(images)
        def build_model():
            return M()
        """, ["images", "example_inputs"]),
    "decoder_too_long": ("""
        from transformers import WhisperConfig, WhisperForConditionalGeneration
        def build_model():
            return WhisperForConditionalGeneration(WhisperConfig(
                d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                max_source_positions=24, max_target_positions=32))
        """, ["'decoder_input_ids'", "max_target_positions = 32", "example_inputs"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_an_input_autoplan_cannot_build_exits_2_naming_it(case, tmp_path):
    body, expected = BAD[case]
    path = tmp_path / f"{case}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    result = CliRunner().invoke(app, ["trace", str(path), "--seq-len", "64"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert all(word in text for word in expected), text
    assert "Traceback" not in result.output
