"""Exporters: turn a plan into the files a training framework launches from.

Each target is a module with an ``exporter`` (:class:`Exporter`) registered under the
``autoplan.exporters`` entry-point group, so other packages can add targets without touching
autoplan. When autoplan runs from a source tree without installed metadata the built-in targets
are used directly.

Launchers that want the settings rather than files use the per-target functions:
``megatron_args``, ``deepspeed_config``, ``torchtitan_overrides``, ``accelerate_config``,
``colossalai_plugin_kwargs``, ``torchtune_overrides``.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points
from pathlib import Path

from autoplan.capabilities import BUILTIN_TARGETS as BUILTIN
from autoplan.capabilities import EXPORTER_GROUP as GROUP
from autoplan.capabilities import TARGET_RUNTIME
from autoplan.errors import ExportError
from autoplan.plan import Result
from autoplan.plugins.accelerate import accelerate_config
from autoplan.plugins.colossalai import colossalai_plugin_kwargs
from autoplan.plugins.deepspeed import deepspeed_config
from autoplan.plugins.exporter import Exporter
from autoplan.files import refuse_existing, write_errors_as, write_files
from autoplan.plugins.megatron import megatron_args
from autoplan.plugins.torchtitan import torchtitan_overrides
from autoplan.plugins.torchtune import torchtune_overrides

logger = logging.getLogger(__name__)


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


def priced_for(result: Result, target: str) -> Result:
    """The result as ``target``'s files state it: the plan priced on the runtime that target
    runs (``Result.estimates_by_runtime``), e.g. a Megatron-LM plan exported for DeepSpeed
    carries DeepSpeed's step time. Targets without a runtime of their own (accelerate,
    Colossal-AI), and plans not priced there, keep the plan's own runtime, which the files'
    header names."""
    runtime = TARGET_RUNTIME.get(target)
    if runtime is None or result.training is None or result.training.runtime == runtime.value:
        return result
    estimate = (result.estimates_by_runtime or {}).get(runtime.value)
    if estimate is None:
        return result
    return result.model_copy(update={
        "estimate": estimate,
        "training": result.training.model_copy(update={"runtime": runtime.value})})


def render_targets(result: Result, target: str) -> tuple[dict[str, str], list[str]]:
    """``{file name: text}`` for ``target`` (a name or ``"all"``), nothing written, and for
    ``"all"`` the targets that cannot run the plan, each ``"name: reason"``.

    Raises:
        ExportError: unknown target, the named target refuses the plan, or every target does.
    """
    files: dict[str, str] = {}
    refusals = []
    for exporter in _targets(target):
        try:
            files.update(exporter.render(priced_for(result, exporter.name)))
        except ExportError as err:
            if target != "all":
                raise
            refusals.append(f"{exporter.name}: {err}")
            logger.info("not exporting %s: %s", exporter.name, err)
    if not files:
        raise ExportError("no target can run this plan. " + " ".join(refusals))
    return files, refusals


def render_all(result: Result, target: str) -> dict[str, str]:
    """The files of :func:`render_targets`.

    Raises:
        ExportError: see :func:`render_targets`.
    """
    return render_targets(result, target)[0]


def refused_targets(result: Result) -> list[str]:
    """The targets of ``export --to all`` that cannot run the plan, each ``"name: reason"``."""
    return render_targets(result, "all")[1]


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


__all__ = ["EXPORTERS", "Exporter", "discover", "export_plan", "render_all", "render_targets",
           "refused_targets", "priced_for", "megatron_args",
           "deepspeed_config", "torchtitan_overrides", "accelerate_config",
           "colossalai_plugin_kwargs", "torchtune_overrides"]
