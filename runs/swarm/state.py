"""The state averager through which the coordinator downloads a run's collaboration state (for
checkpoints, runs/swarm/checkpoints.py, and spot checks, runs/swarm/spotcheck.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing

from hivemind.compression import deserialize_tensor_stream
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture
from hivemind.utils.asyncio import aiter_with_timeout

from peer_agent.averaging import EpochStateServing, StateSourceChoice, declared_epochs

logger = logging.getLogger(__name__)

# What ``state_download_from`` (and the checkpointer's, runs/swarm/checkpoints.py) answers for a peer
# no stream could be opened to: the local daemon could not dial it (a killed peer's process and daemon
# are gone, and its address refuses), unlike a peer that was reached and sent nothing in time. A killed
# peer stays declared as a state source for hivemind's declare period (30 s): the validator
# (runs/swarm/spotcheck.py) tells the two apart.
UNREACHABLE = "unreachable"


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

    def state_download_from(self, peer: str, *, timeout: float, silence: float,
                            kept: tuple[int, str] | None = None) -> tuple[dict, list] | str | None:
        """The parameters of the state ``peer`` serves now (in ``main_parameters`` order, fp32) and the state's
        metadata, without loading them (peer_agent.averaging.EpochStateServing): the validator
        (runs/swarm/spotcheck.py) compares the states of several peers it chose itself. With ``kept`` (an epoch
        and a parameters' sketch), the parameters the peer kept for that epoch and sketch instead
        (peer_agent.averaging.EpochStates). None if the peer sent no state within ``timeout``, or nothing for
        ``silence`` seconds; ``UNREACHABLE`` if it could not be reached at all (runs/swarm/checkpoints.py)."""
        future = MPFuture()
        self._outer_pipe.send(("_state_download_from", [], dict(peer=peer, timeout=timeout, silence=silence,
                                                                 kept=kept, future=future)))
        try:
            return future.result(timeout=timeout + 5)  # the averager's process answers within its own timeout
        except TimeoutError:  # it did not (CI, on a loaded host): the peer counts as silent, the next is asked
            return None

    async def _state_download_from(self, peer: str, timeout: float, silence: float, kept: tuple[int, str] | None,
                                   future: MPFuture) -> None:
        # Runs in the averager's process, like hivemind's _load_state_from_peers; one peer, asked by name.
        metadata = []

        async def tensor_parts():
            stub = self.get_stub(self._p2p, PeerID.from_base58(peer), namespace=self.prefix)
            if kept is None:
                stream = await stub.rpc_download_parameters(averaging_pb2.DownloadRequest())
            else:
                asked = self.serializer.dumps(dict(epoch=kept[0], sketch=kept[1]))
                stream = await stub.rpc_download_epoch_state(averaging_pb2.DownloadData(metadata=asked))
            async for message in aiter_with_timeout(stream, timeout=silence):
                if message.metadata:
                    metadata.append(self.serializer.loads(message.metadata))
                yield [message.tensor_part]

        try:
            tensors = await asyncio.wait_for(deserialize_tensor_stream(tensor_parts()), timeout)
            future.set_result((metadata[0], tensors) if metadata and isinstance(metadata[0], dict) else None)
        except ControlFailure as e:  # the daemon opened no stream: the peer is gone
            future.set_result(UNREACHABLE)
            logger.debug("peer %s unreachable: %r", peer, e)
        except Exception as e:  # a peer slow or hostile: the caller asks another
            future.set_result(None)
            logger.debug("no state from peer %s: %r", peer, e)
