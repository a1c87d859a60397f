"""Import a user's model.py and check the contract: ``build_model()`` on the meta device."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from autoplan.errors import ModelFileError


@dataclass(frozen=True)
class ModelSource:
    """A model.py, imported: its name and the contract's functions."""

    name: str
    build_model: Callable[[], nn.Module]
    example_inputs: Callable[[int, int], Any] | None
    loss: Callable[[Any, Any], torch.Tensor] | None


def _import_file(path: Path) -> types.ModuleType:
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file; pass the path of a model.py.")
    module_name = f"autoplan_user_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        # User code may print; keep stdout clean for --json.
        with contextlib.redirect_stdout(io.StringIO()):
            spec.loader.exec_module(module)
    except SyntaxError as err:
        raise ModelFileError(
            f"{path}: syntax error at line {err.lineno}: {err.msg}. Fix the file so it imports."
        ) from None
    except Exception as err:  # user code: any failure is their error to fix
        raise ModelFileError(
            f"{path}: importing it raised {type(err).__name__}: {err}. model.py must import "
            "cleanly and define build_model()."
        ) from None
    sys.modules.pop(module_name, None)
    return module


def load_model_source(source: str | Path | types.ModuleType) -> ModelSource:
    """Load model.py (a path) or an already imported module and check it defines build_model."""
    module = source if isinstance(source, types.ModuleType) else _import_file(Path(source))
    origin = getattr(module, "__file__", None) or module.__name__
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise ModelFileError(
            f"{origin}: defines no build_model(). Add `def build_model() -> torch.nn.Module` "
            "that constructs the model (it is called under torch.device('meta'))."
        )
    name = Path(origin).stem if origin.endswith(".py") else module.__name__
    return ModelSource(
        name=name,
        build_model=build,
        example_inputs=getattr(module, "example_inputs", None),
        loss=getattr(module, "loss", None),
    )


@contextlib.contextmanager
def _initializers_skipped():
    """``torch.nn.init``'s in-place initializers return their tensor untouched: a meta tensor
    holds no values to fill, yet each call runs torch's reference kernel (half the time of
    building a 105-layer GPT). Restored on exit."""
    names = [n for n in vars(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(nn.init, n) for n in names}
    for name in names:
        setattr(nn.init, name, _unchanged)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _unchanged(tensor, *args, **kwargs):
    return tensor


def build_on_meta(source: ModelSource) -> nn.Module:
    """Call build_model() under the meta device (initializers skipped: there is nothing to
    fill) and check nothing real was allocated."""
    try:
        with torch.device("meta"), _initializers_skipped(), \
                contextlib.redirect_stdout(io.StringIO()):
            model = source.build_model()
    except Exception as err:
        raise ModelFileError(
            f"{source.name}: build_model() raised {type(err).__name__}: {err}. It must build the "
            "model without loading weights (it runs under torch.device('meta'))."
        ) from None
    if not isinstance(model, nn.Module):
        raise ModelFileError(
            f"{source.name}: build_model() returned {type(model).__name__}, not a "
            "torch.nn.Module. Return the model itself."
        )
    real = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != "meta"]
    if real:
        raise ModelFileError(
            f"{source.name}: build_model() created real tensors ({', '.join(real[:3])}...). "
            "Build with default constructors only: no torch.load, no .to('cpu'/'cuda'), no "
            "explicit device= arguments, so that autoplan can trace without memory."
        )
    return model
