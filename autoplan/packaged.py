"""The YAML files that ship inside the package (the hardware catalog, the runtime profiles).

They are parsed on every solve, so through libyaml's C parser when PyYAML has it (ten times
faster than the pure-Python one; both build the same values from these files, which are
known good). Users' files keep the pure-Python ``yaml.safe_load``, whose error messages the
CLI quotes.
"""

from __future__ import annotations

from importlib import resources

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(package: str, name: str):
    """The parsed document ``name`` of ``package``."""
    return yaml.load(resources.files(package).joinpath(name).read_text(), Loader=_LOADER)
