"""The state averager through which the coordinator downloads a run's collaboration state (for
checkpoints, runs/swarm/checkpoints.py, and spot checks, runs/swarm/spotcheck.py)."""

from __future__ import annotations

import math
import multiprocessing

from hivemind.optim.state_averager import TrainingStateAverager

from peer_agent.averaging import EpochStateServing, StateSourceChoice, declared_epochs


class BoundedSourceStateAverager(EpochStateServing, StateSourceChoice, TrainingStateAverager):
    """A client-mode ``TrainingStateAverager`` that downloads only from peers whose declared epoch is
    within a bound.

    hivemind downloads from the peer that declares the highest "state sharing priority", which
    peers set to their epoch, under ``{prefix}.all_averagers`` in the DHT. One member declaring a
    far epoch would be asked first every time, and its state refused every time
    (``checkpoints.state_epoch_trusted``): while it stayed online no checkpoint could be saved. Peers
    declaring more than the bound are left out of the choice instead.
    """

    _rpc_handlers = None  # hivemind collects a class's handlers once; this class adds one to its bases'

    def __init__(self, *args, **kwargs):
        # Shared memory, made before hivemind forks the averager's process, which reads it.
        self._epoch_bound = multiprocessing.Value("d", math.inf)
        super().__init__(*args, **kwargs)

    @classmethod
    def _get_handle_name(cls, namespace, method_name):
        # hivemind names an averager's RPC streams after its class: ask for the state by the name the
        # peers' averagers serve it under (peer_agent.averaging.MembersOnlyStateAverager keeps it too).
        return TrainingStateAverager._get_handle_name(namespace, method_name)

    def load_state_from_peers(self, *, max_epoch: float = math.inf, **kwargs):
        """hivemind's download from the highest-priority peer that declares at most ``max_epoch``."""
        self._epoch_bound.value = max_epoch
        return super().load_state_from_peers(**kwargs)

    def state_sources_choose(self, declared: dict) -> dict:
        bound, epochs = self._epoch_bound.value, declared_epochs(declared)
        return {peer: entry for peer, entry in declared.items() if epochs.get(peer, -math.inf) <= bound}
