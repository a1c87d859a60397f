"""The framework-validator tests' imports: missing in CI is a failure, elsewhere a skip."""

import pytest

from tests.extras import require, require_installed

MISSING = "autoplan_no_such_framework"


def test_a_missing_test_dependency_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=MISSING):
        require(MISSING)


def test_a_missing_test_dependency_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=MISSING):
        require(MISSING)


def test_a_missing_optional_extra_skips_even_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.skip.Exception, match=r"\.\[ray\]"):
        require(MISSING, extra="ray")


def test_a_present_dependency_is_the_module():
    assert require("json").dumps([1]) == "[1]"


def test_a_missing_distribution_fails_in_ci_and_a_present_one_is_found(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=MISSING):
        require_installed(MISSING)
    assert (require_installed("pytest") / "pytest" / "__init__.py").is_file()
