"""Ctrl-C and SIGTERM for the agent and the coordinator (peer_agent.join.StopRequest): the process
stops cleanly, and a hivemind process forked from it still dies of SIGTERM."""

import os
import signal
import threading
import time

import pytest

from peer_agent.join import StopRequest
from tests.processes import forked_child


@pytest.fixture
def handlers_restored():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


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
