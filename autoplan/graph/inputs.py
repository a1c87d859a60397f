"""Default inputs for a model.py that writes no ``example_inputs``, read off ``forward``'s signature.

A plain module (``forward(self, tokens)``) gets int64 token ids ``[b, s]`` as its first argument,
the documented default. A Hugging Face model takes every input as an optional keyword, so the
signature alone says which it needs; the model's config says the shapes:

- ``input_ids``: token ids ``[b, seq_len]``;
- ``decoder_input_ids`` (encoder-decoders: T5, BART, Whisper): token ids ``[b, seq_len]``;
- ``pixel_values`` (vision: ViT): ``[b, num_channels, image_size, image_size]``;
- ``input_features`` (speech: Whisper): log-mel frames ``[b, num_mel_bins, 2 * max_source_positions]``.

Any other argument forward requires is the user's to build: that is a ``ModelFileError`` naming it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autoplan.errors import ModelFileError

_WRITE_EXAMPLE_INPUTS = "Define example_inputs(batch_size, seq_len) in model.py to build it."


def _tokens(config: Any, batch: int, seq_len: int) -> torch.Tensor:
    return torch.zeros(batch, seq_len, dtype=torch.long)


def _decoder_tokens(config: Any, batch: int, seq_len: int) -> torch.Tensor:
    """Decoder token ids at the requested length, within a learned position table if it has one
    (Whisper's decoder: ``max_target_positions``)."""
    limit = _config_value(config, "max_target_positions")
    if limit is not None and seq_len > limit:
        raise ValueError(
            f"the decoder holds at most max_target_positions = {limit} tokens, fewer than "
            f"--seq-len {seq_len}; pass --seq-len {limit} or less")
    return torch.zeros(batch, seq_len, dtype=torch.long)


def _pixels(config: Any, batch: int, seq_len: int) -> torch.Tensor:
    """One image per sample at the config's size; the sequence is the patch grid, not --seq-len."""
    size = _required(config, "image_size")
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return torch.zeros(batch, _config_value(config, "num_channels") or 3, height, width)


def _mel_frames(config: Any, batch: int, seq_len: int) -> torch.Tensor:
    """Log-mel features of the full window the encoder expects: Whisper's conv stem (strides 1
    and 2, transformers' modeling_whisper.py) turns ``2 * max_source_positions`` frames into its
    ``max_source_positions`` positions and refuses any other length."""
    return torch.zeros(batch, _required(config, "num_mel_bins"),
                       2 * _required(config, "max_source_positions"))


_BUILDERS: dict[str, Callable[[Any, int, int], torch.Tensor]] = {
    "input_ids": _tokens,
    "decoder_input_ids": _decoder_tokens,
    "pixel_values": _pixels,
    "input_features": _mel_frames,
}


def _config_value(config: Any, key: str) -> Any:
    """A config key, also looked up in a vision or audio sub-config (CLIP-style composites)."""
    for part in (config, getattr(config, "vision_config", None), getattr(config, "audio_config", None)):
        value = getattr(part, key, None) if part is not None else None
        if value is not None:
            return value
    return None


def _required(config: Any, key: str) -> Any:
    value = _config_value(config, key)
    if value is None:
        raise ValueError(f"the model has no config.{key} to size it by")
    return value


def default_inputs(name: str, model: nn.Module, batch: int, seq_len: int) -> Any:
    """Inputs for ``model`` built from ``forward``'s signature: a tensor for the first argument
    when token ids are all it needs (as before the signature was read), else a dict of keyword
    inputs (a Hugging Face encoder-decoder, vision or speech model)."""
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p.name for p in params if p.default is p.empty]
    if required or not params:
        return _plain_inputs(name, required, batch, seq_len)
    config = getattr(model, "config", None)
    wanted = [p.name for p in params if p.name in _BUILDERS]
    if "decoder_input_ids" in wanted and not getattr(config, "is_encoder_decoder", False):
        wanted.remove("decoder_input_ids")
    if not wanted:
        _no_known_input(name, params)
    if wanted == ["input_ids"] and params[0].name == "input_ids":
        return _tokens(config, batch, seq_len)
    return {key: _build(name, key, config, batch, seq_len) for key in wanted}


def _plain_inputs(name: str, required: list[str], batch: int, seq_len: int) -> torch.Tensor:
    """The first required argument (or ``forward(*args)``'s first) gets token ids; autoplan
    cannot guess a second one."""
    if len(required) > 1:
        raise ModelFileError(
            f"{name}: forward() requires the argument {required[1]!r} besides {required[0]!r}, "
            f"and autoplan builds only the first (int64 token ids [b, s]). {_WRITE_EXAMPLE_INPUTS}")
    return _tokens(None, batch, seq_len)


def _no_known_input(name: str, params: list[inspect.Parameter]) -> None:
    raise ModelFileError(
        f"{name}: forward() takes none of the inputs autoplan can build ({', '.join(_BUILDERS)}); "
        f"its arguments are {', '.join(p.name for p in params[:6])}. {_WRITE_EXAMPLE_INPUTS}")


def _build(name: str, key: str, config: Any, batch: int, seq_len: int) -> torch.Tensor:
    try:
        return _BUILDERS[key](config, batch, seq_len)
    except (ValueError, TypeError) as err:
        raise ModelFileError(f"{name}: cannot build forward's {key!r}: {err}. {_WRITE_EXAMPLE_INPUTS}") from None
