"""Quantities with units at the edges (YAML, CLI), SI floats inside.

Bandwidths are bytes/s, memory bytes, time seconds, compute FLOP/s. A bare number where a unit
belongs is an error: "200" could be Gb/s or GB/s, a factor of eight apart.
"""

from __future__ import annotations

import math
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


def _scaled(value: float, prefixes: tuple[tuple[float, str], ...], unit: str = "") -> str:
    """``value`` over the largest of ``prefixes`` it reaches, to three digits, with the
    prefix and the ``unit`` (after a space when there is one)."""
    space = " " if unit else ""
    for divisor, prefix in prefixes:
        if value >= divisor:
            return f"{value / divisor:.3g}{space}{prefix}{unit}"
    return f"{value:.0f}{space}{unit}"


def format_count(count: float) -> str:
    """``12.3M``, ``1.2B``, ``125K``: a parameter count at the scale it has (a tiny model is
    not "0.00B")."""
    return _scaled(count, ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")))


def format_flops(flops: float) -> str:
    """``3.4 TFLOP``, ``12.3 GFLOP``, ``450 MFLOP``: a FLOP count at its scale (a tiny model's
    layers are not "0.0 GFLOP")."""
    return _scaled(flops, ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")),
                   "FLOP")


def format_seconds(seconds: float) -> str:
    """``1.234 s``, ``12.3 ms``, ``450 µs``: a duration in the unit that shows its digits."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def gib_digits(a_gib: float, b_gib: float) -> int:
    """Decimals that tell two GiB figures apart (a near miss differs by MiBs, which one
    decimal rounds away), from one to four."""
    digits = 1
    while digits < 4 and f"{a_gib:.{digits}f}" == f"{b_gib:.{digits}f}":
        digits += 1
    return digits


def format_excess(need_gib: float, limit_gib: float) -> str:
    """How far a need is over a limit: ``19.5 GiB``, or under 0.1 GiB the whole MiB in which
    plans are compared, the need rounded up and the limit down (``41 MiB``, not ``0.0 GiB``)."""
    if need_gib - limit_gib >= 0.1:
        return f"{need_gib - limit_gib:.1f} GiB"
    return f"{math.ceil(need_gib * 1024) - math.floor(limit_gib * 1024):,} MiB"
