"""A user's model.py as the API holds it: traced once per (sequence length, precision) in a
guarded child process (model.py is user code), each trace kept in memory and on disk.

torch is imported only when a trace actually runs, so the commands that do not trace (and a
solve whose trace is cached) never pay for it.
"""

from __future__ import annotations

import functools
import logging
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autoplan.errors import ModelFileError
from autoplan.graph import trace_cache
from autoplan.graph.layer_graph import LayerGraph
from autoplan.graph.sandbox import DEFAULT_TIME_LIMIT_S as DEFAULT_TRACE_TIME_LIMIT_S
from autoplan.graph.sandbox import Guarded
from autoplan.training import Precision

if TYPE_CHECKING:
    from autoplan.graph.loader import ModelSource

logger = logging.getLogger(__name__)


@functools.cache
def _warm_up() -> None:
    """Trace a one-Linear model here once, so torch's lazy imports (its meta kernels' Python
    references; about 0.5 s, torch._dynamo left out: ``no_compile``) happen before the sandbox
    forks and every child inherits them."""
    import torch

    from autoplan.graph.loader import load_model_source
    from autoplan.graph.trace import trace_model

    module = types.ModuleType("autoplan_warm_up")
    module.build_model = lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    module.example_inputs = lambda batch, seq_len: torch.zeros(batch, seq_len, 8)
    trace_model(load_model_source(module), seq_len=4)


def _trace_origin(origin: Path | types.ModuleType, seq_len: int, precision: str
                  ) -> tuple[LayerGraph, list[Path]]:
    """Import model.py and trace it (run inside the sandbox's child process); also the source
    files of the modules the import brought in (for the trace cache's key)."""
    from autoplan.graph.loader import load_model_source
    from autoplan.graph.trace import trace_model

    before = set(sys.modules)
    graph = trace_model(load_model_source(origin), seq_len=seq_len, precision=precision)
    imported = [sys.modules[name] for name in set(sys.modules) - before]
    return graph, trace_cache.local_sources(imported)


@dataclass
class Model:
    """A model.py (a path or an imported module); traces are cached per (sequence length,
    precision) and run in a guarded child process, since model.py is user code. A path's
    traces are also kept on disk (:mod:`autoplan.graph.trace_cache`) unless ``cache`` is off."""

    origin: Path | types.ModuleType
    trace_time_limit_s: float = DEFAULT_TRACE_TIME_LIMIT_S
    cache: bool = True
    _traces: dict[tuple[int, str], LayerGraph] = field(default_factory=dict, repr=False)
    _started: dict[tuple[int, str], Guarded] = field(default_factory=dict, repr=False)
    _source: ModelSource | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        if isinstance(self.origin, types.ModuleType):
            return self.origin.__name__
        return self.origin.stem

    @property
    def source(self) -> ModelSource:
        """model.py imported into this process (for runners that build the real model)."""
        from autoplan.graph.loader import load_model_source

        if self._source is None:
            self._source = load_model_source(self.origin)
        return self._source

    def trace(self, seq_len: int, precision: str = "bf16") -> LayerGraph:
        """The model traced at ``seq_len`` in ``precision``'s 16-bit storage dtype (an FP8
        run keeps its weights and activations in bf16: training.Precision.storage)."""
        key = _key(seq_len, precision)
        if key not in self._traces:
            self._traces[key] = self._cached_trace(*key)
        return self._traces[key]

    def start_trace(self, seq_len: int, precision: str = "bf16") -> None:
        """Begin the trace ``trace(seq_len, precision)`` will return, where neither memory nor
        the disk cache has it: its child imports torch and traces while this process goes on
        (the CLI starts it before importing the search). Errors come with ``trace``."""
        key = _key(seq_len, precision)
        if key in self._traces or key in self._started:
            return
        graph = self._from_disk(*key)
        if graph is not None:
            self._traces[key] = graph
            return
        self._started[key] = self._guarded_trace(*key)

    def _cached_trace(self, seq_len: int, precision: str) -> LayerGraph:
        """The disk cache's trace of a model.py path, or a fresh one (then stored there)."""
        started = self._started.pop((seq_len, precision), None)
        if started is None:
            graph = self._from_disk(seq_len, precision)
            if graph is not None:
                return graph
            _warm_up()
            started = self._guarded_trace(seq_len, precision)
        graph, sources = started.result()
        if self._on_disk:
            trace_cache.store(self.origin, seq_len, precision, graph, sources)
        return graph

    @property
    def _on_disk(self) -> bool:
        return self.cache and isinstance(self.origin, Path) and trace_cache.enabled()

    def _from_disk(self, seq_len: int, precision: str) -> LayerGraph | None:
        """The disk cache's trace (a model.py path with the cache on), or None."""
        if not self._on_disk:
            return None
        graph = trace_cache.load(self.origin, seq_len, precision)
        if graph is not None:
            logger.info("trace of %s (seq %d, %s) from the cache", self.name, seq_len, precision)
        return graph

    def _guarded_trace(self, seq_len: int, precision: str) -> Guarded:
        return Guarded(_trace_origin, self.origin, seq_len, precision,
                       what=f"tracing {self.name}", time_limit_s=self.trace_time_limit_s)


def _key(seq_len: int, precision: str) -> tuple[int, str]:
    """A trace's (sequence length, storage precision): FP8 runs are traced in bf16."""
    return seq_len, Precision.FP8.storage if precision == Precision.FP8.value else precision


def load_model(path_or_module: str | Path | types.ModuleType | Model, *,
               trace_time_limit_s: float = DEFAULT_TRACE_TIME_LIMIT_S,
               cache: bool = True) -> Model:
    """A model.py (path) or an imported module defining ``build_model()``. Nothing of it runs
    here: it is imported and traced in a guarded child process when first traced. ``cache``
    False: never read or write the on-disk trace cache."""
    if isinstance(path_or_module, Model):
        return path_or_module
    if isinstance(path_or_module, types.ModuleType):
        return Model(path_or_module, trace_time_limit_s, cache)
    if not isinstance(path_or_module, (str, Path)):
        raise ModelFileError(f"model: expected the path of a model.py, an imported module or a "
                             f"Model; got {type(path_or_module).__name__}.")
    path = Path(path_or_module)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file; pass the path of a model.py.")
    return Model(path, trace_time_limit_s, cache)
