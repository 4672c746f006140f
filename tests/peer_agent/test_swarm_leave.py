"""A peer that leaves clears its progress record for good, even when hivemind's tracker reports once more
on its way out: the swarm must not count a peer that left (tests/e2e/test_preemption.py)."""

import threading
import time
from types import SimpleNamespace

import pytest
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.optim.progress_tracker import ProgressTracker

from peer_agent.training import SwarmPeer

pytestmark = pytest.mark.swarm
REPORTER_LATE_S = 0.5  # how late a loaded machine wakes the tracker's reporter thread after the shutdown


class LateWake(threading.Event):
    """The reporter's wake-up event, woken late once the shutdown is triggered, as on a loaded machine."""

    def __init__(self, shutdown_triggered: threading.Event):
        super().__init__()
        self.shutdown_triggered = shutdown_triggered

    def wait(self, timeout=None):
        woken = super().wait(timeout)
        if self.shutdown_triggered.is_set():
            time.sleep(REPORTER_LATE_S)
        return woken


def record_of(observer: DHT, tracker: ProgressTracker):
    """The leaving peer's progress record as another peer reads it: its value, None once cleared."""
    found = observer.get(tracker.training_progress_key, latest=True)
    entry = found.value.get(tracker._local_public_key) if found is not None else None
    return entry.value if entry is not None else None


def test_the_record_stays_cleared_after_the_trackers_last_report():
    # Records are signed, as the monitor reads them (runs/swarm/monitor.py): a peer without the validator
    # cannot parse them.
    observer = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], record_validators=[RSASignatureValidator()])
    dht = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=observer.get_visible_maddrs())
    tracker = ProgressTracker(dht=dht, prefix="leave", target_batch_size=1000, start=False)
    tracker.should_report_progress = LateWake(tracker.shutdown_triggered)
    tracker.start()
    peer = SwarmPeer()
    peer.optimizer, peer.dht = SimpleNamespace(tracker=tracker), dht
    try:
        tracker.report_local_progress(local_epoch=0, samples_accumulated=10)
        deadline = time.monotonic() + 30
        while record_of(observer, tracker) is None:
            assert time.monotonic() < deadline, "the peer's progress record never reached the other peer"
            time.sleep(0.1)

        peer._progress_withdraw()
        time.sleep(2 * REPORTER_LATE_S)  # the reporter's last store, if it made one, has landed

        assert record_of(observer, tracker) is None
    finally:
        tracker.shutdown(timeout=5)
        dht.shutdown()
        observer.shutdown()
