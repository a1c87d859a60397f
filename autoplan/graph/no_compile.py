"""Trace without importing torch._dynamo, which a trace does not use.

torch marks the Python code it runs for meta tensors as not to be compiled: every
TorchDispatchMode's ``__torch_dispatch__`` (FlopCounterMode's included) and the elementwise
reference kernels of ``torch._refs`` (``torch._compile._disable_dynamo``). The mark builds
its wrapper on the first call, and building it imports all of torch._dynamo, about 2 s of
CPU here, the largest part of a cold trace. The wrapper only matters while torch.compile
traces Python code, and a trace on the meta device compiles nothing; so while a trace runs,
each marked function is given itself as the wrapper (the mark's own cache, the function's
``__dynamo_disable`` attribute) and runs as it is. The marks are restored afterwards, so
code that compiles later in the process finds torch as it was. Nothing is changed when
torch._dynamo is already imported (its wrappers are then cheap to build) or when this torch's
marks look different (the trace then pays the import, as before). The layer graph is the same
either way (tests/graph/test_no_compile.py).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
from collections.abc import Iterator

import torch
import torch._compile

_CACHE = "__dynamo_disable"
"""Where ``torch._compile._disable_dynamo`` keeps the wrapper it built for a function."""


def marked_functions() -> list[types.FunctionType]:
    """The functions behind the marks that exist now and have no wrapper yet: each mark is a
    function of the mark's own code holding the marked function in its closure (``fn``)."""
    code = torch._compile._disable_dynamo(lambda: None).__code__
    if "fn" not in code.co_freevars:
        return []
    slot, found = code.co_freevars.index("fn"), {}
    for mark in gc.get_objects():  # about 0.05 s: marks are made inside torch, unnamed
        if type(mark) is types.FunctionType and mark.__code__ is code:
            function = mark.__closure__[slot].cell_contents
            if type(function) is types.FunctionType and getattr(function, _CACHE, None) is None:
                found[id(function)] = function
    return list(found.values())


@contextlib.contextmanager
def dynamo_left_unloaded() -> Iterator[None]:
    """Within the block, torch's marked functions run without importing torch._dynamo."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    functions = marked_functions()
    for function in functions:
        setattr(function, _CACHE, function)
    try:
        yield
    finally:
        for function in functions:
            if getattr(function, _CACHE, None) is function:
                delattr(function, _CACHE)
