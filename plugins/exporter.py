"""The record a target module registers under the ``autoplan.exporters`` entry-point group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoplan.plan import Result


@dataclass(frozen=True, slots=True)
class Exporter:
    """One launch target.

    ``render`` turns a plan into ``{file name: text}``; it raises
    :class:`autoplan.errors.ExportError` when the target cannot run the plan as planned, so that
    a user learns it before a cluster allocation does.
    """

    name: str
    description: str
    render: Callable[[Result], dict[str, str]]
