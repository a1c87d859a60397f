"""Shared fixtures: the repository's examples and the published-runs helper."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="session")
def examples() -> Path:
    return ROOT / "examples"


@pytest.fixture(autouse=True)
def _own_trace_cache(tmp_path_factory, monkeypatch):
    """Each test traces into a cache of its own (never the user's ~/.cache/autoplan), so tests
    stay independent of each other and of earlier runs."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
