"""Exporters: turn a plan into the files a training framework launches from.

Each target is a module with an ``exporter`` (:class:`Exporter`) registered under the
``autoplan.exporters`` entry-point group, so other packages can add targets without touching
autoplan. When autoplan runs from a source tree without installed metadata the built-in targets
are used directly.

Launchers that want the settings rather than files use the per-target functions:
``megatron_args``, ``deepspeed_config``, ``torchtitan_overrides``, ``accelerate_config``,
``colossalai_plugin_kwargs``.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points
from pathlib import Path

from autoplan.errors import ExportError
from autoplan.plan import Result
from autoplan.plugins.accelerate import accelerate_config
from autoplan.plugins.colossalai import colossalai_plugin_kwargs
from autoplan.plugins.deepspeed import deepspeed_config
from autoplan.plugins.exporter import Exporter
from autoplan.files import refuse_existing, write_errors_as, write_files
from autoplan.plugins.megatron import megatron_args
from autoplan.plugins.torchtitan import torchtitan_overrides

logger = logging.getLogger(__name__)

GROUP = "autoplan.exporters"
BUILTIN = ("megatron", "deepspeed", "torchtitan", "accelerate", "colossalai", "torchrun")


def discover() -> dict[str, Exporter]:
    """Exporters by name: the entry points of ``autoplan.exporters``, else the built-ins."""
    found = {ep.name: ep.load() for ep in entry_points(group=GROUP)}
    if not found:
        found = {name: importlib.import_module(f"autoplan.plugins.{name}").exporter
                 for name in BUILTIN}
    return dict(sorted(found.items()))


EXPORTERS: dict[str, Exporter] = discover()


def _targets(target: str) -> list[Exporter]:
    if target == "all":
        return list(EXPORTERS.values())
    if target not in EXPORTERS:
        raise ExportError(f"unknown export target {target!r}; choose one of "
                          f"{', '.join(EXPORTERS)} or 'all'.")
    return [EXPORTERS[target]]


def render_all(result: Result, target: str) -> dict[str, str]:
    """``{file name: text}`` for ``target`` (a name or ``"all"``), nothing written.

    With ``"all"``, a target that cannot run the plan is left out with a warning naming the
    reason; a single named target that cannot run it raises.

    Raises:
        ExportError: unknown target, the named target refuses the plan, or every target does.
    """
    files: dict[str, str] = {}
    refusals = []
    for exporter in _targets(target):
        try:
            files.update(exporter.render(result))
        except ExportError as err:
            if target != "all":
                raise
            refusals.append(f"{exporter.name}: {err}")
            logger.warning("not exporting %s: %s", exporter.name, err)
    if not files:
        raise ExportError("no target can run this plan. " + " ".join(refusals))
    return files


def export_plan(result: Result, target: str, out_dir: Path, *, force: bool = False) -> list[Path]:
    """Write the launch files of ``target`` (a name or ``"all"``) into ``out_dir``.

    Files are written atomically; an existing file is overwritten only with ``force`` and, if
    one would be, nothing is written.

    Raises:
        ExportError: see :func:`render_all`, or a file exists and ``force`` is false.
    """
    out_dir = Path(out_dir)
    files = render_all(result, target)
    if not force:
        refuse_existing([out_dir / name for name in files], error=ExportError)
    with write_errors_as(ExportError):
        return write_files(files, out_dir)


__all__ = ["EXPORTERS", "Exporter", "discover", "export_plan", "render_all", "megatron_args",
           "deepspeed_config", "torchtitan_overrides", "accelerate_config",
           "colossalai_plugin_kwargs"]
