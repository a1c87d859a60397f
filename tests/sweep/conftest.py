"""Shared fixtures: a tiny model (traced once per session) and small clusters."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan import api

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TINY = EXAMPLES / "models" / "tiny_gpt.py"
DGX16 = EXAMPLES / "clusters" / "dgx-a100-x16.yaml"
ETHERNET = EXAMPLES / "clusters" / "pcie-x2-10gbe.yaml"


@pytest.fixture(scope="session")
def tiny():
    return api.load_model(TINY)


@pytest.fixture(scope="session")
def dgx16():
    return api.load_cluster(DGX16)
