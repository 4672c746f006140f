"""The collaboration's progress as a peer sees it: its own, and the swarm's from the peers' progress records."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

from hivemind.dht import DHT
from hivemind.optim.optimizer import Optimizer
from hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time

SWARM_READ_PERIOD_S = 5.0


@dataclass(frozen=True)
class SwarmProgress:
    """What a progress display shows about this peer and the collaboration."""

    local_epoch: int
    global_epoch: int
    local_samples_per_second: float  # smoothed over recent steps, as hivemind measures it
    collaboration_samples_per_second: float | None  # sum over peers' reports; None before the first read
    samples_accumulated: int  # towards the next global step, over all peers
    target_batch_size: int
    num_peers: int  # peers reporting progress now, clients included
    num_clients: int
    eta_next_epoch_s: float  # estimated seconds until the next averaging round; inf while unknown


class SwarmProgressReader:
    """Reads the collaboration's progress without blocking: what hivemind's tracker last read, and the
    peers' throughput summed from the run's progress records, read again in the background every
    ``SWARM_READ_PERIOD_S``."""

    def __init__(self, dht: DHT, run_id: str, optimizer: Optimizer):
        self.dht, self.run_id, self.optimizer = dht, run_id, optimizer
        self._read, self._read_at = None, -math.inf
        self._collaboration_sps: float | None = None

    def progress(self) -> SwarmProgress:
        """This peer's and the collaboration's progress now."""
        tracker = self.optimizer.tracker
        swarm = tracker.global_progress
        self._poll()
        return SwarmProgress(
            local_epoch=self.optimizer.local_epoch, global_epoch=swarm.epoch,
            local_samples_per_second=float(tracker.performance_ema.samples_per_second),
            collaboration_samples_per_second=self._collaboration_sps,
            samples_accumulated=swarm.samples_accumulated, target_batch_size=swarm.target_batch_size,
            num_peers=swarm.num_peers, num_clients=swarm.num_clients,
            eta_next_epoch_s=max(0.0, swarm.eta_next_epoch - get_dht_time()))

    def _poll(self) -> None:
        """Sum the peers' reported throughput from the progress records, refreshed in the background."""
        if self._read is not None and self._read.done():
            with contextlib.suppress(Exception):
                found = self._read.result()
                entries = found.value.values() if found is not None and isinstance(found.value, dict) else ()
                self._collaboration_sps = sum(
                    float(entry.value.get("samples_per_second", 0.0)) for entry in entries
                    if isinstance(entry, ValueWithExpiration) and isinstance(entry.value, dict))
            self._read = None
        if self._read is None and time.monotonic() - self._read_at >= SWARM_READ_PERIOD_S:
            self._read_at = time.monotonic()
            self._read = self.dht.get(f"{self.run_id}_progress", latest=True, return_future=True)
