"""Fixtures of the end-to-end tests."""

import pytest

from runs.coordinator import Coordinator


@pytest.fixture
def coordinator(settings, tmp_path):
    settings.COORDINATOR_STATE_DIR = str(tmp_path / "coordinator")
    coordinator = Coordinator(interval=1.0)
    yield coordinator
    for peer in coordinator.peers.values():
        peer.shutdown()
