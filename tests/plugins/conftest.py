"""Shared fixtures of the exporter tests."""

from __future__ import annotations

import pytest

from autoplan.plan import Result
from tests.plugins.plans import PLAN_NAMES, load_plan


@pytest.fixture(params=PLAN_NAMES)
def any_plan(request) -> Result:
    """Each fixture plan in turn."""
    return load_plan(request.param)
