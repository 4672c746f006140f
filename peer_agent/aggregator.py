"""An aggregator: a peer that joins a run's averaging rounds without computing (DeDLOC's auxiliary peers).

A server with a good link but no accelerator helps volunteers on thin links most by reducing part of
their all-reduce: hivemind's auxiliary mode (``Optimizer(auxiliary=True)``, ``AveragingMode.AUX``)
joins the gradient and parameter rounds with the peer's declared bandwidth, sends no vector of its
own (weight 0) and returns the average of the part the partition gives it (``peer_agent.averaging``:
the bandwidth LP, with the floor applied to aggregators as to every peer that accepts connections).
Its membership proof is checked like anyone's; its access token names the role ("#aggregator").
It reports no samples to the portal, and earns no credit.
"""

from __future__ import annotations

import logging
import zlib

from peer_agent.model import model_build
from peer_agent.training import TrainerSetup, dht_start, optimizer_build

logger = logging.getLogger(__name__)


class Aggregator:
    """One auxiliary peer of a run; call :meth:`step` every second or so: it joins the rounds the swarm's
    progress calls for and returns the collaboration epoch it is in."""

    def __init__(self, setup: TrainerSetup, *, vocab_size: int, pad_token_id: int = 0):
        if setup.client_mode:
            raise ValueError("an aggregator must accept connections from the run's peers: it cannot run in client mode")
        self.setup = setup
        # Only the parameters' shapes matter: an aggregator reduces other peers' slices of them.
        model = model_build(setup.config, vocab_size, pad_token_id=pad_token_id, init_seed=zlib.crc32(setup.run_id.encode()))
        self.dht = dht_start(setup)
        try:
            self.optimizer = optimizer_build(setup, self.dht, model, auxiliary=True)
        except BaseException:
            self.dht.shutdown()
            raise
        self._shut_down = False

    def step(self) -> int:
        """Join the averaging round that is due, if any (it blocks while the round runs); the local epoch."""
        self.optimizer.step()
        return self.optimizer.local_epoch

    @property
    def local_epoch(self) -> int:
        return self.optimizer.local_epoch

    def shutdown(self) -> None:
        """Leave the swarm: the optimizer's averagers and tracker, then the DHT. Calling it again does nothing."""
        if self._shut_down:
            return
        self._shut_down = True
        try:
            self.optimizer.shutdown()
        finally:
            self.dht.shutdown()

    def __enter__(self) -> Aggregator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()
