"""Run user code (importing model.py, tracing it) in a child process with a time limit and an
address-space cap, its output kept off our stdout.

model.py is someone else's code: it may loop forever, allocate real tensors for a trillion
parameters, or print. The child is forked (it inherits the imported libraries, so it starts in
milliseconds), its stdout goes to /dev/null so ``--json`` stays one document, and whatever it
returns or raises comes back pickled. A child that runs out of time is killed; one that exits
(sys.exit in model.py) or dies by a signal (killed by the OS for memory, a segfault in native
code) is reported as such.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import resource
import signal
import time
import traceback
from typing import Any, Callable

from autoplan.errors import AutoplanError, ModelFileError

DEFAULT_TIME_LIMIT_S = 120.0
"""Tracing a trillion-parameter model takes about a second; two minutes means a runaway."""

DEFAULT_MEMORY_HEADROOM_BYTES = 8 * 2**30
"""Address space the child may add to what it inherits: ample for meta tracing, far below what
a model that really allocates its weights would need."""


def _address_space_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(conn, fn: Callable, args: tuple, headroom: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    faulthandler.disable()  # a crash is reported by the parent, not dumped on stderr
    try:
        import torch  # before the cap: a child started ahead (Guarded) imports it here, and a
        torch.set_num_threads(1)  # CUDA build maps gigabytes; no OpenMP team in a forked child
        limit = _address_space_bytes() + headroom
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        conn.send(("ok", fn(*args)))
    except AutoplanError as err:
        conn.send(("error", err))
    except MemoryError:
        conn.send(("memory", None))
    except SystemExit as err:
        conn.send(("exit", err.code))
    except BaseException as err:  # anything else is reported, not re-raised in the child
        conn.send(("crash", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"))
    finally:
        conn.close()


def _death_message(what: str, exitcode: int | None) -> str:
    """Why a child that sent nothing back ended: a signal (negative exit code) or an exit."""
    if exitcode is not None and exitcode < 0 and -exitcode != signal.SIGKILL:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else "?"
        return (f"{what} crashed (signal {-exitcode}, {name}) in native code called by model.py "
                "(a C extension, ctypes or a library bug), not in Python. Run model.py on its own "
                "to find the call; autoplan only needs build_model() with default constructors.")
    if exitcode is not None and exitcode >= 0:
        return (f"{what} ended the process (exit code {exitcode}) without an answer: model.py "
                "must not call os._exit() or exit the interpreter; remove the call.")
    return (f"{what} was killed (SIGKILL), most likely by the OS for memory. build_model() must "
            "not allocate real tensors: build with default constructors (autoplan runs them "
            "under torch.device('meta')), load no weights.")


def run_guarded(fn: Callable, *args: Any, what: str,
                time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                memory_headroom_bytes: int = DEFAULT_MEMORY_HEADROOM_BYTES) -> Any:
    """``fn(*args)`` in a forked child; its result, or its AutoplanError re-raised here.

    Raises:
        ModelFileError: the child timed out, ran out of memory or died.
    """
    return Guarded(fn, *args, what=what, time_limit_s=time_limit_s,
                   memory_headroom_bytes=memory_headroom_bytes).result()


class Guarded:
    """``run_guarded`` started now and answered later: the child works while this process
    goes on (``Model.start_trace``); ``result()`` waits for it, the time limit counted from
    the start."""

    def __init__(self, fn: Callable, *args: Any, what: str,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 memory_headroom_bytes: int = DEFAULT_MEMORY_HEADROOM_BYTES):
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe(duplex=False)
        self._process = context.Process(target=_child,
                                        args=(child, fn, args, memory_headroom_bytes),
                                        daemon=True)
        self._deadline = time.monotonic() + time_limit_s
        self._what, self._time_limit_s = what, time_limit_s
        self._process.start()
        child.close()

    def result(self) -> Any:
        """What the child returned, or its error raised here (see ``run_guarded``)."""
        kind, payload = self._answer()
        if kind == "ok":
            return payload
        if kind == "error":
            raise payload
        what = self._what
        if kind == "exit":
            raise ModelFileError(
                f"{what} stopped: model.py called sys.exit({payload!r}). model.py must not "
                "exit: remove the call, or put script code under `if __name__ == '__main__':`.")
        if kind == "memory":
            raise ModelFileError(
                f"{what} ran out of memory: it allocates real tensors. Build the model with "
                "default constructors only (no torch.load, no device= arguments, no "
                ".to('cpu'/'cuda')).")
        raise ModelFileError(f"{what} failed unexpectedly: {payload}")

    def _answer(self) -> tuple[str, Any]:
        process, conn = self._process, self._conn
        try:
            if not conn.poll(max(0.0, self._deadline - time.monotonic())):
                process.kill()
                raise ModelFileError(
                    f"{self._what} did not finish within {self._time_limit_s:g} s and was "
                    "stopped. build_model() and the forward pass must not loop or wait; on the "
                    "meta device they take seconds even for trillion-parameter models. If yours "
                    "really needs longer, raise the limit: --trace-timeout SECONDS (options "
                    "file: trace_timeout; Python: autoplan.load_model(path, "
                    "trace_time_limit_s=...)).")
            return conn.recv()
        except EOFError:
            process.join(timeout=5)
            raise ModelFileError(_death_message(self._what, process.exitcode)) from None
        finally:
            process.join(timeout=5)
            conn.close()
