"""Ctrl-C and SIGTERM for the agent and the coordinator (peer_agent.join.StopRequest): the process
stops cleanly, and a hivemind process forked from it still dies of SIGTERM."""

import multiprocessing
import os
import signal
import threading
import time

import pytest

from peer_agent.join import StopRequest


@pytest.fixture
def handlers_restored():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def _sleep_when_ready(ready) -> None:
    ready.set()
    time.sleep(60)


def forked_child() -> multiprocessing.Process:
    """A forked child that sleeps, once it runs Python code of its own: a signal that arrives while the
    interpreter is still settling after the fork is cleared by it, and would make the test flaky."""
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=_sleep_when_ready, args=(ready,), daemon=True)
    child.start()
    assert ready.wait(30)
    return child


def test_sigterm_asks_to_stop_and_a_second_signal_quits_at_once(handlers_restored):
    stopping = threading.Event()
    StopRequest(event=stopping, notice="stopping").install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stopping.wait(5)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs between bytecodes of this thread


def test_a_forked_child_still_dies_of_sigterm(handlers_restored):
    # As hivemind's DHT does when it "terminates it the hard way": a child that ignored this left
    # the coordinator waiting for it forever at exit.
    StopRequest().install()
    child = forked_child()
    child.terminate()
    child.join(10)
    assert not child.is_alive()
    assert child.exitcode == -signal.SIGTERM
