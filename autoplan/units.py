"""Quantities with units at the edges (YAML, CLI), SI floats inside.

Bandwidths are bytes/s, memory bytes, time seconds, compute FLOP/s. A bare number where a unit
belongs is an error: "200" could be Gb/s or GB/s, a factor of eight apart.
"""

from __future__ import annotations

import re

from autoplan.errors import UnitError

_NUMBER = r"(?P<value>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>[A-Za-z/]+)"

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}

KINDS_EXAMPLE = {
    "memory": "80GiB",
    "bandwidth": "300GB/s",
    "time": "5us",
    "flops": "312TFLOPS",
}


def _memory_factor(unit: str) -> float | None:
    for prefix, factor in _BINARY.items():
        if unit == f"{prefix}B":
            return float(factor)
    if unit.endswith("B") and unit[:-1] in _PREFIX:
        return _PREFIX[unit[:-1]]
    return None


def _bandwidth_factor(unit: str) -> float | None:
    for suffix, bytes_per_unit in (("B/s", 1.0), ("Bps", 1.0), ("bps", 0.125), ("b/s", 0.125)):
        if unit.endswith(suffix) and unit[: -len(suffix)] in _PREFIX:
            return _PREFIX[unit[: -len(suffix)]] * bytes_per_unit
    return None


def _time_factor(unit: str) -> float | None:
    return {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}.get(unit)


def _flops_factor(unit: str) -> float | None:
    for suffix in ("FLOPS", "FLOP/s", "flops"):
        if unit.endswith(suffix) and unit[: -len(suffix)] in _PREFIX:
            return _PREFIX[unit[: -len(suffix)]]
    return None


_FACTORS = {
    "memory": _memory_factor,
    "bandwidth": _bandwidth_factor,
    "time": _time_factor,
    "flops": _flops_factor,
}


def parse_quantity(text: object, kind: str, *, field: str = "value") -> float:
    """Parse ``"80GiB"``, ``"200Gbps"``, ``"5us"`` or ``"312TFLOPS"`` into an SI float.

    Args:
        text: the user's value; must be a string with a unit.
        kind: one of ``memory``, ``bandwidth``, ``time``, ``flops``.
        field: the field's name, used in the error message.

    Raises:
        UnitError: the value is a bare number, or its unit is not of ``kind``.
    """
    example = KINDS_EXAMPLE[kind]
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"{field}: expected a {kind} with a unit such as {example!r}, got {text!r}.")
    match = re.fullmatch(_NUMBER, str(text).strip().replace("µ", "u"))
    if match is None:
        raise UnitError(
            f"{field}: {text!r} has no unit; write the unit next to the number, e.g. {example!r}."
        )
    factor = _FACTORS[kind](match["unit"])
    if factor is None:
        raise UnitError(
            f"{field}: {match['unit']!r} is not a unit of {kind}; write e.g. {example!r}."
        )
    return float(match["value"]) * factor


GIB = float(2**30)


def format_count(count: float) -> str:
    """``12.3M``, ``1.20B``, ``125K``: a parameter count at the scale it has (a tiny model is
    not "0.00B")."""
    for divisor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= divisor:
            return f"{count / divisor:.3g}{suffix}"
    return f"{count:.0f}"


def format_seconds(seconds: float) -> str:
    """``1.234 s``, ``12.3 ms``, ``450 µs``: a duration in the unit that shows its digits."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"
