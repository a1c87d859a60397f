"""Tests that take longer than a few seconds on 2 cores are marked ``slow`` and run only with
``AUTOPLAN_SLOW=1`` in the environment: the verification cases fork their ranks and are fast;
launching the exported script with torchrun starts fresh interpreters and is not."""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process case, run with AUTOPLAN_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("AUTOPLAN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow multi-process case; set AUTOPLAN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
