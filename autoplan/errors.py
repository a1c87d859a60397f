"""Errors a user can cause. Each carries a message that says what to change and an exit code."""

from __future__ import annotations


class AutoplanError(Exception):
    """Base class: a mistake in the input, reported without a traceback (exit code 2)."""

    exit_code = 2


class ModelFileError(AutoplanError):
    """model.py is missing, does not import, or its build_model() misbehaves."""


class ClusterSpecError(AutoplanError):
    """cluster.yaml is malformed, lacks a unit, or names an unknown GPU or link."""


class UnitError(AutoplanError):
    """A quantity is missing its unit or has one of the wrong kind."""


class ConstraintError(AutoplanError):
    """Pins or training settings contradict each other before any search (e.g. tp*pp > GPUs)."""


class PlanFileError(AutoplanError):
    """A plan JSON file cannot be read back."""


class InfeasibleError(AutoplanError):
    """No plan satisfies the requirements; the message explains which and by how much (exit 3)."""

    exit_code = 3


class NoPlanInTimeError(AutoplanError):
    """The time limit was hit before any plan was found (exit 4)."""

    exit_code = 4


class ExportError(AutoplanError):
    """A plan cannot be written for a launcher: the target cannot express it, a file exists, or
    the plan JSON lacks what the target needs (model dimensions, hosts)."""


class OutputExistsError(AutoplanError):
    """A file autoplan would write (sweep results, plots, a PNG) exists and --force was not
    given."""


class VerifyError(AutoplanError):
    """A plan did not run as planned under ``autoplan verify`` (exit 5)."""

    exit_code = 5
