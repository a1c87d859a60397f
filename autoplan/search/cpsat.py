"""OR-Tools' CP-SAT module, ``cp_model``, imported without importing pandas.

cp_model imports pandas at its top only for its ``*_series`` helpers (variables indexed by a
pandas Index), which autoplan does not call; pandas, with the pyarrow it loads, costs about
0.8 s of CPU here, more than everything else a warm solve imports besides. So, unless
pandas is already imported, cp_model is imported with a stand-in under the name ``pandas``
whose every name forwards to the real pandas when used: an ``isinstance`` test against
``pd.Series`` tests against the real class once pandas is imported (before that nothing can
be a Series, so it is false), and a call such as ``pd.Series(...)`` imports pandas and makes
the real object. The stand-in leaves ``sys.modules`` as soon as cp_model is in, so any later
``import pandas`` gets the real module. Import ``cp_model`` from here before anything imports
it directly (``search.solve`` does, first), or the forwarding is not needed and not used.
"""

from __future__ import annotations

import importlib
import sys
import types


class _Forwarded(type):
    """A pandas name (``Series``, ``Index``) whose every use goes to the real pandas'."""

    def _real(cls):
        return getattr(importlib.import_module("pandas"), cls.__name__)

    def __instancecheck__(cls, obj) -> bool:
        pandas = _imported_pandas()
        return pandas is not None and isinstance(obj, getattr(pandas, cls.__name__))

    def __subclasscheck__(cls, other) -> bool:
        pandas = _imported_pandas()
        return pandas is not None and issubclass(other, getattr(pandas, cls.__name__))

    def __call__(cls, *args, **kwargs):
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, name: str):
        return getattr(cls._real(), name)


class _StandIn(types.ModuleType):
    """The module cp_model sees as ``pandas`` while it is imported."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        forwarded = _Forwarded(name, (), {})
        setattr(self, name, forwarded)
        return forwarded


def _imported_pandas() -> types.ModuleType | None:
    """The real pandas if something has imported it, else None."""
    pandas = sys.modules.get("pandas")
    return None if pandas is None or isinstance(pandas, _StandIn) else pandas


def _import_cp_model() -> types.ModuleType:
    if "pandas" in sys.modules or "ortools.sat.python.cp_model" in sys.modules:
        return importlib.import_module("ortools.sat.python.cp_model")
    sys.modules["pandas"] = _StandIn("pandas")
    try:
        return importlib.import_module("ortools.sat.python.cp_model")
    finally:
        del sys.modules["pandas"]


cp_model = _import_cp_model()
