"""`manage.py run_coordinator` stops on SIGTERM, and the hivemind processes it forks still die of it
(before, a forked DHT that inherited a bare handler ignored SIGTERM, and the coordinator never exited)."""

import os
import signal
import threading

import pytest
from django.core.management import call_command

from runs.management.commands import run_coordinator
from tests.processes import forked_child


@pytest.fixture
def handlers_restored():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_sigterm_stops_the_coordinator_and_ends_its_forked_children(handlers_restored, monkeypatch):
    seen = {}

    class Swarmless:
        """Stands in for the Coordinator: what is tested is the command's handling of signals."""

        def __init__(self, *, slug, interval):
            self.stopping = threading.Event()

        def serve(self):
            child = forked_child()  # as hivemind's DHT and averagers are
            os.kill(os.getpid(), signal.SIGTERM)
            seen["stopping"] = self.stopping.wait(5)
            child.terminate()  # hivemind's last resort for a child that does not shut down
            child.join(10)
            seen["child exit"] = child.exitcode

    monkeypatch.setattr(run_coordinator, "Coordinator", Swarmless)
    call_command("run_coordinator")
    assert seen == {"stopping": True, "child exit": -signal.SIGTERM}
