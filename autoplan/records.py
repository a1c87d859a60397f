"""Helpers for the frozen records the cost models key their memos by."""

from __future__ import annotations

from dataclasses import fields


def kept_hash(record) -> int:
    """The hash of a frozen dataclass's compared fields, computed once and kept in its
    ``_hash`` field (declared ``field(default=0, init=False, repr=False, compare=False)``):
    links and splits are hashed thousands of times a search as memo keys."""
    if not record._hash:
        object.__setattr__(record, "_hash", hash(tuple(getattr(record, f.name)
                                                       for f in fields(record) if f.compare)))
    return record._hash
