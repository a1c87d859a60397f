"""The degrees of a plan, each named once: its Plan field (the key in plan JSON), its name
as a pin (``Pins``, the CLI flag, the sweep axis, the options file's ``pins:``), its type and
what it means.

Pins, flags and sweep axes say ``mbs``, ``zero``, ``sp``; the Plan says ``micro_batch_size``,
``zero_stage``, ``sequence_parallel`` (the JSON contract). ``Pins``, the CLI's pin options and
the sweep's pin axes are built from ``DEGREES``, and code that crosses from one vocabulary to
the other goes through ``plan_fields`` (pin names -> Plan keywords) or ``of_plan`` (a Plan's
degrees by pin name), so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable

from pydantic import Field

from autoplan.plan import Offload, Plan, Recompute


@dataclass(frozen=True, slots=True)
class Degree:
    """One dimension of a plan the user may pin."""

    name: str
    """Its pin name: the ``Pins`` field, the flag (``--`` + name with ``-`` for ``_``), the
    sweep axis and the solver's variable."""
    plan: str
    """The ``Plan`` field that holds it (its plan JSON key)."""
    kind: type
    """The type of its values: int, bool, an enum or str."""
    doc: str
    """What it is (the CLI's help text)."""
    low: int | None = None
    """Smallest value of an int degree."""
    high: int | None = None
    """Largest value of an int degree."""
    swept: bool = True
    """An axis of sweep files and ``sweep --over``."""
    words: str = ""
    """How a sentence names it (``micro-batch``); empty: its pin name in capitals."""

    @property
    def option(self) -> str:
        """The CLI option, e.g. ``--recompute-num-layers``."""
        return "--" + self.name.replace("_", "-")

    @property
    def flag(self) -> str:
        """The option as declared: a bool one has its negation, ``--sp/--no-sp``."""
        return f"{self.option}/--no-{self.option[2:]}" if self.kind is bool else self.option

    def given(self, value: Any) -> str:
        """The flag as a user types it for ``value``: ``--mbs 2``, ``--sp``, ``--no-sp``."""
        if self.kind is bool:
            return self.option if value else f"--no-{self.option[2:]}"
        return f"{self.option} {getattr(value, 'value', value)}"

    def bounds(self) -> dict[str, int]:
        """``ge``/``le`` keywords of its pydantic field (none where unbounded)."""
        return {k: v for k, v in (("ge", self.low), ("le", self.high)) if v is not None}

    @property
    def label(self) -> str:
        """How a sentence names it: ``micro-batch``, ``TP``."""
        return self.words or self.name.upper()

    @property
    def plain(self) -> type:
        """The type as a YAML file writes it: an enum by its value (a str)."""
        return str if issubclass(self.kind, Enum) else self.kind


DEGREES: tuple[Degree, ...] = (
    Degree("tp", "tp", int, "Tensor-parallel degree.", low=1),
    Degree("pp", "pp", int, "Pipeline-parallel degree.", low=1),
    Degree("dp", "dp", int, "Data-parallel degree.", low=1),
    Degree("cp", "cp", int, "Context-parallel degree.", low=1, swept=False),
    Degree("mbs", "micro_batch_size", int, "Micro-batch size.", low=1, words="micro-batch"),
    Degree("zero", "zero_stage", int, "ZeRO stage.", low=0, high=3, words="ZeRO stage"),
    Degree("recompute", "recompute", Recompute, "Activation recomputation.", words="recompute"),
    Degree("recompute_num_layers", "recompute_num_layers", int,
           "With full recompute: only the first N blocks of each model chunk (Megatron's "
           "--recompute-method block).", low=1, swept=False),
    Degree("sp", "sequence_parallel", bool, "Sequence parallelism.", words="sequence parallel"),
    Degree("vpp", "vpp", int, "Model chunks per pipeline rank (1: no interleaving).", low=1,
           words="chunks per rank"),
    Degree("offload", "offload", Offload, "CPU offload.", words="offload"),
    Degree("placement", "placement", str,
           "Rank order, innermost axis first: tp-cp-dp-pp (every runtime) or tp-cp-pp-dp "
           "(Megatron's --use-tp-pp-dp-mapping: pipeline neighbours share a node).", swept=False),
    Degree("ep", "ep", int, "Expert-parallel degree of MoE layers: experts split over ep ranks "
           "carved out of dp*cp (Megatron's --expert-model-parallel-size).", low=1, swept=False),
)
"""Every pinnable degree, in the order of ``Pins`` (and so of ``Pins.pinned``)."""

DEGREE: dict[str, Degree] = {d.name: d for d in DEGREES}
"""The degrees by pin name."""

SWEPT: tuple[str, ...] = tuple(d.name for d in DEGREES if d.swept)
"""The degrees a sweep may hold fixed or vary, by pin name."""


def plan_fields(**degrees: Any) -> dict[str, Any]:
    """Degrees given by pin name, keyed by their Plan fields instead (``Plan`` keywords):
    ``plan_fields(mbs=2, zero=1)`` is ``{"micro_batch_size": 2, "zero_stage": 1}``."""
    return {DEGREE[name].plan: value for name, value in degrees.items()}


def of_plan(plan: Plan, names: Iterable[str] = tuple(DEGREE)) -> dict[str, Any]:
    """A plan's degrees (those ``names``, by default all) by pin name."""
    return {name: getattr(plan, DEGREE[name].plan) for name in names}


def pin_fields() -> dict[str, tuple[Any, Any]]:
    """Each degree as an optional field (None: search it), for ``pydantic.create_model``:
    the fields of ``Pins``."""
    return {d.name: (d.kind | None, Field(default=None, description=d.doc, **d.bounds()))
            for d in DEGREES}


def sweep_fields(*, lists: bool = False) -> dict[str, tuple[Any, Any]]:
    """The swept degrees as optional fields of plain values (an enum by its value, as YAML
    writes it), or with ``lists`` as lists of them: the pin inputs of a sweep point and the
    pin axes of a sweep."""
    if lists:
        return {name: (list[DEGREE[name].plain] | None, None) for name in SWEPT}
    return {name: (DEGREE[name].plain | None, Field(default=None, **DEGREE[name].bounds()))
            for name in SWEPT}
