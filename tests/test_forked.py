"""autoplan.forked: calls answered by a forked child that keeps its own state."""

import os
import signal

import pytest

from autoplan.errors import ConstraintError
from autoplan.forked import ForkedWorker, WorkerDiedError

state = {"count": 0}


def _count(step: int) -> int:
    state["count"] += step
    return state["count"]


def _refuse() -> None:
    raise ConstraintError("no such plan")


def _bug() -> None:
    {}["missing"]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _worker() -> ForkedWorker:
    return ForkedWorker({"count": _count, "refuse": _refuse, "bug": _bug, "die": _die,
                         "pid": os.getpid}, what="a test")


def test_calls_are_answered_in_order_by_a_child_that_keeps_its_state():
    worker = _worker()
    try:
        tickets = [worker.submit("count", step) for step in (1, 10, 100)]
        assert worker.result(tickets[2]) == 111  # later answers first: the earlier are kept
        assert [worker.result(t) for t in tickets] == [1, 11, 111]
        assert worker.call("count", 1) == 112
        assert worker.call("pid") != os.getpid()
        assert state["count"] == 0  # the child's state, not this process's
    finally:
        worker.close()


def test_errors_come_back_to_be_raised_here():
    worker = _worker()
    try:
        with pytest.raises(ConstraintError, match="no such plan"):
            worker.call("refuse")
        with pytest.raises(KeyError) as bug:  # a bug keeps its type and the child's traceback
            worker.call("bug")
        assert "raised in a forked worker" in bug.value.__notes__[0]
        assert "_bug" in bug.value.__notes__[0]
        assert worker.call("count", 5) == 5  # the child goes on answering
    finally:
        worker.close()


def test_a_child_that_dies_is_an_autoplan_error_naming_the_signal():
    worker = _worker()
    try:
        ticket = worker.submit("die")
        with pytest.raises(WorkerDiedError, match=r"searching a test ended without an answer "
                                                  rf"\(exit code -{int(signal.SIGKILL)}"):
            worker.result(ticket)
    finally:
        worker.close()


def test_ready_tells_without_waiting():
    worker = _worker()
    try:
        ticket = worker.submit("count", 3)
        while not worker.ready(ticket):
            pass
        assert worker.result(ticket) == 3
        assert not worker.ready(ticket + 1)  # nothing submitted: never ready
    finally:
        worker.close()
