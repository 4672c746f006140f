"""Fixtures of the end-to-end tests."""

import logging
import threading
from contextlib import suppress

import pytest
from django.db import connection

from runs.coordinator import Coordinator


@pytest.fixture
def coordinator(settings, tmp_path):
    """A coordinator whose cycles the test runs itself, in the main thread (the checkpointer starts
    hivemind processes, which set signal handlers). Between them a thread keeps its backbone peers'
    heartbeats going, as `serve` does, so that joins keep naming them while they are up."""
    settings.COORDINATOR_STATE_DIR = str(tmp_path / "coordinator")
    coordinator = Coordinator(interval=1.0)
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(1.0):
                for peer in list(coordinator.peers.values()):
                    try:
                        peer.heartbeat()
                    except Exception:  # a locked SQLite table, a peer being shut down: the next beat makes up for it
                        logging.getLogger(__name__).warning("heartbeat failed", exc_info=True)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield coordinator
    stop.set()
    thread.join(timeout=30)
    for peer in coordinator.peers.values():
        with suppress(Exception):
            peer.shutdown()
