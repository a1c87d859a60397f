"""Work done side by side in forked children that keep their state between calls.

``api.solve`` searches each runtime (Megatron-LM, DeepSpeed, FSDP) in its own process: the
searches are independent and pure Python, so on a machine with two or more cores they run in
the time of the longest instead of the sum. A child is forked (it inherits the traced model,
the problems' inputs and the handlers, so nothing is pickled going in) and then answers named
calls in the order they were sent; its search table stays where it was built, and the
follow-up questions that need it (the ZeRO-2/ZeRO-3 plans, the runners-up) are asked there.
Answers and errors come back pickled.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from autoplan.errors import AutoplanError


class WorkerDiedError(AutoplanError):
    """A forked worker ended without answering (killed by the OS, most likely for memory)."""


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


class ForkedWorker:
    """A forked child serving ``handlers`` (name -> callable): ``submit(name, *args)`` queues
    a call and returns its ticket, ``result(ticket)`` waits for its answer (or raises the
    error it raised), calls being answered in the order they were submitted; ``close()``
    ends the child. The child also ends when this side's end of the pipe closes."""

    def __init__(self, handlers: Mapping[str, Callable[..., Any]], what: str):
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._what = what
        self._process = context.Process(target=_serve, args=(child, dict(handlers)))
        self._process.start()
        child.close()
        self._sent = 0
        self._answers: list[tuple[bool, Any]] = []

    def submit(self, name: str, *args: Any) -> int:
        self._conn.send((name, args))
        self._sent += 1
        return self._sent - 1

    def ready(self, ticket: int) -> bool:
        """Whether ``result(ticket)`` would return without waiting."""
        while len(self._answers) <= ticket and self._conn.poll():
            self._answers.append(self._receive())
        return len(self._answers) > ticket

    def result(self, ticket: int) -> Any:
        while len(self._answers) <= ticket:
            self._answers.append(self._receive())
        ok, value = self._answers[ticket]
        if ok:
            return value
        raise value

    def call(self, name: str, *args: Any) -> Any:
        return self.result(self.submit(name, *args))

    def close(self) -> None:
        """End the child: asked to stop, and stopped if it is still busy half a second later
        (with calls no one waits for)."""
        try:
            self._conn.send(None)  # a later child holds this pipe's end too: EOF may not come
        except OSError:
            pass
        self._conn.close()
        self._process.join(timeout=0.5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def _receive(self) -> tuple[bool, Any]:
        try:
            return self._conn.recv()
        except EOFError:
            self._process.join(timeout=5)
            raise WorkerDiedError(
                f"the process searching {self._what} ended without an answer (exit code "
                f"{self._process.exitcode}; a negative one is the signal that stopped it, "
                "SIGKILL most likely the OS for memory). Pin --runtime to search in this "
                "process only, or free memory.") from None


def _serve(conn, handlers: dict[str, Callable[..., Any]]) -> None:
    """The child: answer each call until the parent says stop (None) or closes the pipe.
    Ctrl-C is the parent's to handle (it ends the children), not each child's traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        if call is None:
            return
        name, args = call
        try:
            answer = (True, handlers[name](*args))
        except Exception as err:  # the parent raises it; a bug keeps its traceback
            answer = (False, err if isinstance(err, AutoplanError) else _carried(err))
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            return


def _carried(err: Exception) -> Exception:
    """A non-autoplan error (a bug) as the parent can raise it: itself with the child's
    traceback as a note where it pickles, else a RuntimeError that quotes it."""
    where = f"raised in a forked worker:\n{traceback.format_exc()}"
    try:
        err.__notes__ = [*getattr(err, "__notes__", []), where]  # add_note, Python 3.10 too
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err} ({where})")
