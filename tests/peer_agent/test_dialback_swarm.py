"""The agent's dial-back check (peer_agent/reachability.py) against a real backbone peer on loopback."""

import logging
import threading

import pytest

from peer_agent import reachability
from tests.processes import free_port, running_dht

pytestmark = pytest.mark.swarm


class _Tries(logging.Handler):
    """Sets ``failed`` when the check logs that its p2p daemon reached no backbone peer."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.failed = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "reached no backbone peer" in record.getMessage():
            self.failed.set()


def test_a_check_that_reached_no_backbone_peer_tries_again_and_finds_it(tmp_path, monkeypatch):
    """A loaded machine once made a natted host's first dial to its backbone miss; the daemon exits
    then, and the check answered "none" (client mode) for a peer reachable through the relay."""
    from hivemind.p2p import P2P, PeerID

    identity = tmp_path / "backbone.key"
    P2P.generate_identity(str(identity))
    port = free_port()
    backbone = [f"/ip4/127.0.0.1/tcp/{port}/p2p/{PeerID.from_identity(identity.read_bytes())}"]
    monkeypatch.setattr(reachability, "PROBE_RETRY_PAUSE_S", 15.0)  # time to start the backbone peer
    tries = _Tries()
    logger = logging.getLogger(reachability.__name__)
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    logger.addHandler(tries)
    outcome = []
    try:
        check = threading.Thread(target=lambda: outcome.append(
            reachability.reachability_probe(backbone, host_maddrs=["/ip4/127.0.0.1/tcp/0"])))
        check.start()
        assert tries.failed.wait(120), "the first try found nobody at the backbone's address"
        with running_dht(identity_path=str(identity), host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"]) as dht:
            dht.run_coroutine(reachability.dialback_serve)
            check.join(240)
    finally:
        logger.removeHandler(tries)
    assert outcome and outcome[0].path == "direct", outcome
