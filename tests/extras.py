"""Import of a test dependency that may be missing: a skip on a developer's machine, a failure
in CI (``CI=true``), so the framework-validator tests can never be skipped silently there."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import types
from pathlib import Path

import pytest

CI_EXTRA = "test"
"""The extra CI installs (``pip install -e '.[test]'``); its packages must be present there."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(module: str, *, extra: str = CI_EXTRA) -> types.ModuleType:
    """``module`` imported; when it is missing, fail under CI if ``extra`` is what CI installs,
    else skip (usable at module level and inside a test)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        _missing(f"{module} is not importable ({error})", extra)


def require_installed(distribution: str, *, extra: str = CI_EXTRA) -> Path:
    """The folder an installed distribution's files lie under (its site-packages), found
    without importing it (torchtune's import takes seconds); missing: as :func:`require`."""
    try:
        return Path(importlib.metadata.distribution(distribution).locate_file(""))
    except importlib.metadata.PackageNotFoundError as error:
        _missing(f"{distribution} is not installed ({error})", extra)


def _missing(message: str, extra: str):
    message += f"; pip install -e '.[{extra}]'"
    if extra == CI_EXTRA and in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)
