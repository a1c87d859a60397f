"""Traces kept on disk, so a repeat solve of the same model.py does not trace it again.

An entry lives under ``$XDG_CACHE_HOME/autoplan/traces`` (default ``~/.cache/autoplan``), named
by a hash of everything the trace depends on: the model file's bytes, the sequence length and
precision, the tracing code (``autoplan.graph`` and ``autoplan.zoo``) and the versions of torch,
transformers and peft. It also records the other source files that importing model.py brought
in (a sibling ``layers.py``, an editable package) with their hashes; a changed one makes the
entry a miss. An entry that cannot be read (truncated, another format) is ignored and
rewritten; one that cannot be written is skipped (the cache only saves time). Set
``AUTOPLAN_NO_CACHE=1`` (or pass ``--no-cache``) to neither read nor write it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import pickle
import sysconfig
import types
from functools import cache
from pathlib import Path

from autoplan.files import replacing
from autoplan.graph.layer_graph import LayerGraph

logger = logging.getLogger(__name__)

FORMAT = 1
"""Bumped when an entry's layout changes; entries of another format are misses."""
DISABLE_ENV = "AUTOPLAN_NO_CACHE"
VERSIONED = ("torch", "transformers", "peft")
"""Installed packages whose version changes what a trace of the same file gives."""
TRACING_PACKAGES = ("graph", "zoo")
"""autoplan's subpackages whose code a trace runs (their sources are part of the key)."""


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoplan" / "traces"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@cache
def _code_fingerprint() -> str:
    """The tracing code and the versions of the libraries a trace runs."""
    root = Path(__file__).resolve().parents[1]
    parts = [f"{name}={_version(name)}" for name in VERSIONED]
    for package in TRACING_PACKAGES:
        for path in sorted((root / package).glob("*.py")):
            parts.append(f"{package}/{path.name}:{_digest(path.read_bytes())}")
    return _digest("\n".join(parts).encode())


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def entry_path(model_file: Path, seq_len: int, precision: str) -> Path:
    key = "\n".join([str(FORMAT), _digest(model_file.read_bytes()), str(seq_len), precision,
                     _code_fingerprint()])
    return cache_dir() / f"{model_file.stem}-{_digest(key.encode())[:32]}.pickle"


def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(str(Path(paths[k]).resolve()) for k in ("stdlib", "platstdlib", "purelib",
                                                           "platlib") if k in paths)


def local_sources(modules: list[types.ModuleType]) -> list[Path]:
    """The source files of ``modules`` that are not installed libraries (the user's own
    modules, an editable package): what else a trace of model.py depends on."""
    roots = _installed_roots()
    found = set()
    for module in modules:
        file = getattr(module, "__file__", None)
        if file and file.endswith(".py"):
            path = Path(file).resolve()
            if not str(path).startswith(roots) and path.is_file():
                found.add(path)
    return sorted(found)


def load(model_file: Path, seq_len: int, precision: str) -> LayerGraph | None:
    """The cached trace, or None (no entry, an unreadable one, or a changed source file)."""
    path = entry_path(model_file, seq_len, precision)
    try:
        with open(path, "rb") as handle:
            entry = pickle.load(handle)
        if entry["format"] != FORMAT or not isinstance(entry["graph"], LayerGraph):
            raise ValueError("another format")
    except FileNotFoundError:
        return None
    except Exception as err:  # a truncated or foreign file: a miss, rewritten after tracing
        logger.info("ignoring the unreadable trace cache entry %s (%s)", path, err)
        return None
    for source, digest in entry["sources"]:
        try:
            if _digest(Path(source).read_bytes()) != digest:
                return None
        except OSError:
            return None
    return entry["graph"]


def store(model_file: Path, seq_len: int, precision: str, graph: LayerGraph,
          sources: list[Path]) -> None:
    """Keep ``graph`` for the next run; a cache that cannot be written is skipped."""
    path = entry_path(model_file, seq_len, precision)
    entry = {"format": FORMAT, "graph": graph,
             "sources": [(str(s), _digest(s.read_bytes())) for s in sources if s.is_file()]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            with open(tmp, "wb") as handle:
                pickle.dump(entry, handle, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError as err:
        logger.info("trace cache not written (%s): %s", path, err)
