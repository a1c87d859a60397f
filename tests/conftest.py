"""Shared fixtures: the repository's examples and the published-runs helper."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="session")
def examples() -> Path:
    return ROOT / "examples"
