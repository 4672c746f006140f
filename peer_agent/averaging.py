"""The agent's averagers: gradient averaging that keeps a small share of the vector on every peer
able to aggregate, and gradient and parameter averaging only among the run's token holders.

hivemind partitions the vector among a group by a linear program over the declared bandwidths
(``load_balance_peers``). With three peers at 100 Mbit/s and one at 20, the LP gives the slow
peer no share: it should only send its gradients and read the averages back, both at once. But
hivemind makes a zero-share peer read nothing until it has sent everything
(``AllReduceRunner.should_delay_results``), so its upload and download run one after the other
and the round takes twice what the LP planned (docs/benchmarks.md, section 6). A share of
``MIN_SHARE`` keeps the slow peer's transfers overlapped for a few percent more traffic on it.

Every peer of a group must compute the same partition, so every peer of a run runs this agent.
A firewalled peer (client mode) accepts no connections and keeps its share of 0. An aggregator
(hivemind's auxiliary mode, ``peer-agent aggregate``) sends no vector of its own and only reduces
the part the LP gives it: on a fast link it takes the share the volunteers' thin links cannot.

hivemind checks access tokens on DHT requests only; anyone who knows a peer's address and the
run id could otherwise ask it to lead a group (``rpc_join_group``), then read the members'
gradient or parameter parts and poison the average. So each peer sends a membership proof with its
round's gathered data (:func:`membership_proof`) and averages only with peers whose proof verifies
(:class:`MembershipCheck`): every member checks the whole group before the all-reduce, whoever
leads it (:class:`MembersOnlyAverager`, mixed into both of the Optimizer's averagers). The leader
does not check at admission: that meant wrapping hivemind's join handler, an async generator that
holds matchmaking's lock while suspended, and with the wrapper agents' rounds sometimes found no
group for a whole averaging timeout (docs/deploy.md).
"""

import asyncio
import base64
import logging
import math
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Sequence

# typing's, not collections.abc's: hivemind 1.1.12 tells a streaming handler by the hint's ``_name``
# (hivemind/p2p/servicer.py, ``_strip_iterator_hint``), which only typing's generic alias has.
from typing import AsyncIterator  # noqa: UP035

import torch
from hivemind.averaging.allreduce import AllreduceException, AveragingMode
from hivemind.averaging.averager import DecentralizedAverager
from hivemind.averaging.control import StepControl
from hivemind.averaging.load_balancing import hagenbach_bishoff
from hivemind.compression import TensorRole, deserialize_tensor_stream, serialize_torch_tensor
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.optimizer import Optimizer
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import P2PContext, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure
from hivemind.proto import averaging_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils import MPFuture
from hivemind.utils.asyncio import aiter_with_timeout
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.streaming import split_for_streaming
from hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time

from peer_agent.aggregation import PARAMETERS_RUNNERS, AggregatingAverager
from peer_agent.authorizer import PortalAccessError, PortalAuthorizer, expiration_parse, rsa_public_key_parse
from peer_agent.protocol import FINGERPRINT_WIDTH

logger = logging.getLogger(__name__)

MIN_SHARE = 0.01
FINGERPRINT_BYTES = 4 * FINGERPRINT_WIDTH  # a sketch's float32 values, as commitments carry them in base64
_MEMBERSHIP_LABEL = b"dedloc-portal/averaging-member/v1:"
_VERIFIED_MAX = 4096  # remembered proofs: far more than the peers of a run
_NO_PROOF = "sent no membership proof (not an agent, or one older than membership proofs)"


def shares_with_floor(parts: Sequence[int], can_aggregate: Sequence[bool], floor: float = MIN_SHARE) -> tuple[int, ...]:
    """Raise every aggregating peer's part to ``floor`` of the vector, taking the difference from
    the larger parts in proportion to their size; the parts still sum to the vector's size."""
    total = sum(parts)
    minimum = math.ceil(floor * total)
    aggregators = [index for index, able in enumerate(can_aggregate) if able]
    raised = [index for index in aggregators if parts[index] < minimum]
    if not raised or minimum * len(aggregators) > total:
        return tuple(parts)
    donors = [index for index in range(len(parts)) if index not in raised]
    donated = sum(parts[index] for index in donors)
    scale = (total - minimum * len(raised)) / donated
    scores = [minimum if index in raised else parts[index] * scale for index in range(len(parts))]
    return tuple(int(part) for part in hagenbach_bishoff(total, scores))


def membership_payload(peer_id: PeerID) -> bytes:
    """The bytes a member signs: its libp2p peer id, which libp2p's handshake authenticates on every
    stream, so a proof replayed by another peer does not match that peer's id."""
    return _MEMBERSHIP_LABEL + peer_id.to_bytes()


def membership_proof(authorizer: PortalAuthorizer, peer_id: PeerID) -> list[bytes]:
    """This peer's current access token and, made with the key that token names, a signature over its
    peer id; :class:`PortalAccessError` if the peer holds no valid token."""
    token = authorizer.access_token_current()
    return [token.SerializeToString(), authorizer.peer_key_sign(membership_payload(peer_id))]


class MembershipCheck:
    """Verifies membership proofs against the run's authority; a proof that verified is remembered
    until its token expires, so a group that meets every round costs one check per peer."""

    def __init__(self, authorizer: PortalAuthorizer):
        self._authorizer = authorizer
        self._verified: dict[tuple[bytes, bytes, bytes], float] = {}  # (peer id, token, signature) -> expiration

    def gathered_refusal(self, gathered: bytes, peer_id: PeerID) -> str | None:
        """Why a member's gathered data (``[bandwidth, mode, [its gather, its proof]]``, serialized as
        :class:`MembersOnlyAverager` sends it) does not admit ``peer_id``; None if it does."""
        try:
            _, _, user_gathered = MSGPackSerializer.loads(gathered)
            wrapped = MSGPackSerializer.loads(user_gathered)
        except Exception:  # anyone's bytes, and msgpack raises many kinds of errors on garbage
            return "sent malformed gathered data"
        if not (isinstance(wrapped, list | tuple) and len(wrapped) == 2):
            return _NO_PROOF
        return self.refusal(wrapped[1], peer_id)

    def refusal(self, proof: object, peer_id: PeerID) -> str | None:
        """Why ``proof`` (as decoded from a member's gathered data) does not admit ``peer_id``; None if it does."""
        if proof is None:
            return _NO_PROOF
        if not (isinstance(proof, list | tuple) and len(proof) == 2 and all(isinstance(part, bytes) for part in proof)):
            return "sent a malformed membership proof"
        key = (peer_id.to_bytes(), *proof)
        if self._verified.get(key, float("-inf")) > get_dht_time():
            return None
        reason, token = self._verify(*proof, peer_id)
        if reason is None:
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.clear()
            self._verified[key] = expiration_parse(token.expiration_time)
        return reason

    def _verify(self, token_bytes: bytes, signature: bytes, peer_id: PeerID) -> tuple[str | None, AccessToken | None]:
        try:
            token = AccessToken.FromString(token_bytes)
            public_key = rsa_public_key_parse(token.public_key)
        except Exception:  # the bytes come from anyone, and protobuf raises several kinds of errors on garbage
            return "sent a malformed membership proof", None
        if not self._authorizer.is_token_valid(token):
            return f"holds no valid access token ({token.username!r}'s is expired or not signed by this run's authority)", None
        if not public_key.verify(membership_payload(peer_id), signature):
            return f"showed {token.username!r}'s access token without proving it holds its key for this peer id", None
        return None, token


class MembersOnlyAverager(DecentralizedAverager):
    """A hivemind averager that, given the agent's ``authorizer``, averages only with peers that prove
    they hold an access token of the run; without one it behaves (and sends) exactly as hivemind's.

    The proof travels next to the caller's own gathered data: :meth:`step` sends ``[gather, proof]``,
    and the gathered data a step returns is unwrapped back to each peer's ``gather``, so hivemind's
    epoch sync (``TrainingStateAverager``) sees what it always saw. Mix it in after a hivemind
    averager, ``class X(GradientAverager, MembersOnlyAverager)``: Python's MRO then puts this class
    between that averager and ``DecentralizedAverager``, so the averager's own ``super().step`` calls
    (``schedule_step`` included) pass through :meth:`step`.

    The proof carries the authorizer's token as held now, never fetched in the caller's thread: the
    authorizer's owner keeps it fresh (``PortalAuthorizer.token_refresh_start``)."""

    def __init__(self, *args, authorizer: PortalAuthorizer | None = None, **kwargs):
        # Set before hivemind's constructor, which may start (fork) the averager's process.
        self._authorizer = authorizer
        self._membership = MembershipCheck(authorizer) if authorizer is not None else None
        super().__init__(*args, **kwargs)

    # Called at each round this averager begins, for what it gathers when the caller gives nothing (hivemind's
    # Optimizer gives its gradient rounds nothing): MembersOnlyOptimizer gathers its epoch so.
    gather_default: Callable[[], object] | None = None

    def step(self, gather=None, **kwargs):
        # Runs in the caller's thread; hivemind serializes ``gather`` here and sends it to the group.
        if gather is None and self.gather_default is not None:
            gather = self.gather_default()
        if self._authorizer is not None:
            gather = [gather, self._proof()]
        control = super().step(gather=gather, **kwargs)
        if isinstance(control, StepControl):
            self._round_watch(control)
        return control

    def _round_watch(self, control: StepControl) -> None:
        """Called with each round this averager begins (in the caller's process, which may add callbacks)."""

    def _proof(self) -> list[bytes] | None:
        try:
            return membership_proof(self._authorizer, self.peer_id)
        except PortalAccessError as e:
            logger.warning("Averaging without a membership proof, so peers will refuse this one: %s", e)
            return None

    def _group_refusal(self, group_info) -> str | None:
        for peer_id, gathered in zip(group_info.peer_ids, group_info.gathered):
            refusal = self._membership.gathered_refusal(gathered, peer_id) if peer_id != self.peer_id else None
            if refusal is not None:
                return f"its member {peer_id} {refusal}"
        return None

    async def _aggregate_with_group(self, group_info, min_vector_size: int, **kwargs):
        gathered = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        if self._membership is None:
            return gathered
        # Every member's data was checked to be [gather, proof] before the all-reduce could succeed.
        return {peer_id: wrapped[0] for peer_id, wrapped in gathered.items()}

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        refusal = self._group_refusal(group_info) if self._membership is not None else None
        if refusal is not None:
            # Members' streams to this peer wait on the group's future: cancelling it ends them now.
            self._running_groups[group_info.group_id if group_id is None else group_id].cancel()
            raise AllreduceException(f"not averaging with this group: {refusal}")
        return await super()._run_allreduce_inplace_(tensors, group_info, group_id, **kwargs)


class FlooredGradientAverager(GradientAverager, MembersOnlyAverager, AggregatingAverager):
    """hivemind's ``GradientAverager`` with :func:`shares_with_floor` applied to each group's
    partition (the peers' declared bandwidths and modes travel in ``group_info.gathered``),
    given the agent's ``authorizer``, averaging only among peers that prove they hold a token, and
    combining each part by the run's ``aggregation`` (``peer_agent.aggregation``)."""

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        parts = kwargs.get("peer_fractions")
        if parts is not None:
            bandwidths, mode_ids, _ = zip(*map(self.serializer.loads, group_info.gathered))
            modes = tuple(map(AveragingMode, mode_ids))
            # An auxiliary (an aggregator) sends nothing of its own: aggregating is all it is there for.
            can_aggregate = [mode != AveragingMode.CLIENT and (bandwidth is None or bandwidth > 0)
                             for bandwidth, mode in zip(bandwidths, modes)]
            kwargs["peer_fractions"] = shares_with_floor(parts, can_aggregate)
        return await super()._run_allreduce_inplace_(tensors, group_info, group_id, **kwargs)

    def __init__(self, *args, **kwargs):
        # hivemind 1.1.12's Optimizer downloads a gradient averager's state (a peer's gradient buffers, 72 MB at
        # sahajBERT's size) after each state download, and drops it (hivemind/optim/optimizer.py,
        # ``load_state_from_peers``): a joining peer's link and its source's uplink carried it for nothing.
        # Declaring none, a peer is asked for none, and a joiner's ask finds no source at once.
        kwargs.setdefault("allow_state_sharing", False)
        super().__init__(*args, **kwargs)


class StateSourceChoice:
    """A mixin for a state averager: chooses the peers its state download may ask, from their
    declarations under ``{prefix}.all_averagers`` (:meth:`state_sources_choose`).

    hivemind asks the peers in the order of the "state sharing priority" each declares, a number the
    peer sets (hivemind.Optimizer sets its epoch): a member declaring a high one is asked first every
    time, and whatever it serves is loaded. hivemind 1.1.12's ``_load_state_from_peers``
    (hivemind/averaging/averager.py) reads the declarations with one ``dht.get``; this filters that
    answer in the averager's process."""

    def state_sources_choose(self, declared: dict) -> dict:
        return declared

    async def _load_state_from_peers(self, future, timeout=None):
        dht_get = self.dht.get

        def get(key, *args, **kwargs):
            found = dht_get(key, *args, **kwargs)
            if key.endswith(".all_averagers") and found is not None and isinstance(found.value, dict):
                found = ValueWithExpiration(self.state_sources_choose(found.value), found.expiration_time)
            return found

        self.dht.get = get
        try:
            return await super()._load_state_from_peers(future, timeout)
        finally:
            del self.dht.get


class EpochsApart(Exception):
    """A parameter averaging group whose members are at different epochs (MembersOnlyStateAverager). Not one of
    the exceptions hivemind retries a round on (hivemind/averaging/averager.py, ``_step``)."""


PROGRESS_EVERY_S = 1.0  # how often a state download's progress is passed on

# How long a peer whose gradient round held peers of a later epoch waits for one of them to declare the state it
# stepped to before downloading the swarm's state anyway (MembersOnlyOptimizer._resync): they step at once.
RESYNC_WAIT_S = 5.0
RESYNC_POLL_S = 0.2

# A state download's catch-up (MembersOnlyOptimizer.catch_up): a minute beside the parameters' time at 1 Mbit/s,
# and as many loads as an epoch that passes during each allows.
CATCH_UP_BASE_S = 60.0
CATCH_UP_TRIES = 3

# Epochs in a row a peer whose gradient rounds fail skips its optimizer step (MembersOnlyOptimizer); then it
# steps alone, as hivemind does, so that a peer whose rounds keep failing still trains.
LONE_STEPS_SKIPPED_MAX = 2

# The states an agent keeps for the validator: a few epochs' worth (one state per epoch most often, two when
# background parameter averaging lands mid-epoch). The validator asks for them within seconds of a commitment.
EPOCH_STATES_KEPT = 6


class EpochStates:
    """The parameters this peer's last steps were computed at, by epoch and parameters' sketch (the one
    each step commits to, peer_agent/spotcheck.py), in shared memory that the state averager's process
    serves from (:meth:`EpochStateServing.rpc_download_epoch_state`).

    The validator holds the swarm's state of each epoch by downloading what peers serve at the moment
    (runs/swarm/spotcheck.py). On a loaded machine it sometimes looked while every peer still served the
    previous epoch's parameters and again after they had stepped on: it never saw the state the epoch's
    steps were computed at, and those steps earned nothing. Kept here, that state can be asked for after
    the fact, by the sketch the commitments claim. Kept as computed (fp32): in fp16 (3e-4 relative) most steps
    still recomputed within 0.01 of their fingerprints, but in a demo both agents' steps of one epoch
    recomputed 0.17 and 0.45 away at the rounded state and failed their checks."""

    def __init__(self, shapes: Sequence[torch.Size], slots: int = EPOCH_STATES_KEPT):
        self.shapes = [torch.Size(shape) for shape in shapes]
        size = sum(shape.numel() for shape in self.shapes)
        self._values = torch.zeros(slots, size, dtype=torch.float32).share_memory_()
        self._epochs = torch.full((slots,), -1, dtype=torch.int64).share_memory_()
        self._sketches = torch.zeros(slots, FINGERPRINT_BYTES, dtype=torch.uint8).share_memory_()
        self._next = multiprocessing.Value("i", 0, lock=False)
        self._lock = multiprocessing.Lock()
        self._last: tuple[int, str] | None = None  # in the keeping process only

    def keep(self, epoch: int, sketch: str, parameters: Sequence[torch.Tensor]) -> None:
        """Keep ``parameters`` as the state ``epoch``'s steps with parameters' ``sketch`` were computed at
        (a copy only when the sketch is new: most steps of an epoch share their state)."""
        if self._last == (epoch, sketch):
            return
        with torch.no_grad(), self._lock:
            slot = self._next.value
            self._next.value = (slot + 1) % len(self._epochs)
            self._epochs[slot] = -1
            torch.cat([parameter.detach().reshape(-1).to("cpu", torch.float32) for parameter in parameters],
                      out=self._values[slot])
            self._sketches[slot] = torch.frombuffer(bytearray(base64.b64decode(sketch)), dtype=torch.uint8)
            self._epochs[slot] = epoch
        self._last = (epoch, sketch)

    def find(self, epoch: int, sketch: str) -> list[torch.Tensor] | None:
        """The kept state of ``epoch`` with ``sketch`` (one tensor per parameter), or None."""
        try:
            wanted = torch.frombuffer(bytearray(base64.b64decode(sketch, validate=True)), dtype=torch.uint8)
        except ValueError:
            return None
        if wanted.numel() != FINGERPRINT_BYTES:
            return None
        with self._lock:
            for slot in range(len(self._epochs)):
                if int(self._epochs[slot]) == epoch and torch.equal(self._sketches[slot], wanted):
                    flat = self._values[slot].clone()
                    break
            else:
                return None
        return [part.view(shape) for part, shape in zip(flat.split([shape.numel() for shape in self.shapes]),
                                                        self.shapes, strict=True)]


# What ``EpochStateServing.state_download_from`` answers for a peer
# no stream could be opened to: the local daemon could not dial it (a killed peer's process and daemon
# are gone, and its address refuses), unlike a peer that was reached and sent nothing in time. A killed
# peer stays declared as a state source for hivemind's declare period (30 s): the validator
# (runs/swarm/spotcheck.py) tells the two apart.
UNREACHABLE = "unreachable"


class EpochStateServing:
    """A mixin for a state averager: serves the parameters of its current state, and the states its
    :class:`EpochStates` keeps, to whoever asks by epoch and sketch (the same parameters the peer served,
    at an earlier moment); and downloads either from one peer named. A peer without kept states (the
    portal's own averager) serves none."""

    epoch_states: EpochStates | None = None

    async def rpc_download_epoch_state(self, request: averaging_pb2.DownloadData, _context: P2PContext
                                       ) -> AsyncIterator[averaging_pb2.DownloadData]:
        if self.epoch_states is None:
            return
        try:
            asked = self.serializer.loads(request.metadata)
            epoch, sketch = int(asked["epoch"]), str(asked["sketch"])
        except Exception:  # a malformed request gets an empty answer, like a state this peer does not keep
            return
        tensors = self.epoch_states.find(epoch, sketch)
        if tensors is None:
            return
        async for message in _parameters_stream(self.serializer.dumps(dict(epoch=epoch)), tensors):
            yield message

    async def rpc_download_parameters(self, _request: averaging_pb2.DownloadRequest, _context: P2PContext
                                      ) -> AsyncIterator[averaging_pb2.DownloadData]:
        """The parameters of the state this peer serves now, in fp32, with its metadata: hivemind's
        ``rpc_download_state`` without LAMB's two moments, a third of its bytes. The validator holds only
        parameters (runs/swarm/spotcheck.py); asked for the whole state, the holder took 217 MB at sahajBERT's
        size from a volunteer's uplink for each look, more than most uplinks sent within its bound
        (docs/benchmarks.md, section 28)."""
        if not self.allow_state_sharing:
            return
        metadata, tensors, infos = await self._get_current_state_from_host_process()
        parameters = [tensor for tensor, info in zip(tensors, infos, strict=True) if info.role == TensorRole.PARAMETER]
        async for message in _parameters_stream(metadata, parameters):
            yield message

    def state_download_from(self, peer: str, *, timeout: float, silence: float,
                            kept: tuple[int, str] | None = None) -> tuple[dict, list] | str | None:
        """The parameters of the state ``peer`` serves now (in ``main_parameters`` order, fp32) and the state's
        metadata, without loading them: the validator (runs/swarm/spotcheck.py) compares the states of several
        peers it chose itself, and a peer that joined catches up with the swarm (``MembersOnlyOptimizer``). With
        ``kept`` (an epoch and a parameters' sketch), the parameters the peer kept for that epoch and sketch
        instead (:class:`EpochStates`). None if the peer sent no state within ``timeout``, or nothing for
        ``silence`` seconds; ``UNREACHABLE`` if it could not be reached at all."""
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


async def _parameters_stream(metadata: bytes, tensors: Sequence[torch.Tensor]) -> AsyncIterator[averaging_pb2.DownloadData]:
    """``tensors`` as a state download streams them, uncompressed, ``metadata`` on the first part."""
    for tensor in tensors:
        for part in split_for_streaming(serialize_torch_tensor(tensor)):
            yield averaging_pb2.DownloadData(tensor_part=part, metadata=metadata)
            metadata = b""


def _ahead_in_round(gathered: dict, epoch: int) -> int | None:
    """``epoch + 1`` if at least half of the other members of a gradient round (``gathered``: peer -> the epoch
    each gathered, this peer's ``epoch`` among them) gathered it; None otherwise. An aggregator gathers no epoch.

    A gathered epoch is a member's claim. Rounds of two epochs meet only the next one; a peer further behind is
    hivemind's tracker's to find, so a claim of a far epoch moves nobody. A claim of the next epoch in every round
    would make every peer of its rounds download the swarm's state each epoch: one member's claim moves no peer
    whose round holds two others. In a round of three it still does: this peer cannot tell a liar at the next
    epoch from an honest member there (docs/trust.md)."""
    epochs = [value for value in gathered.values() if isinstance(value, int) and not isinstance(value, bool)]
    ahead = epochs.count(epoch + 1)
    return epoch + 1 if ahead and 2 * ahead >= len(epochs) - 1 else None


def declared_epochs(declared: dict) -> dict:
    """The declarations hivemind would consider (a number each), by peer."""
    return {peer: entry.value for peer, entry in declared.items()
            if isinstance(entry, ValueWithExpiration) and isinstance(entry.value, int | float)}


def state_sources(own: bytes, declared: dict, *, swarm_epoch: int = -1) -> dict:
    """The members an agent (``own``) may load the swarm's state from, among those ``declared``: each
    declaring an epoch from the agent's own up to one past the swarm's.

    The swarm's epoch is the median of the other members' declarations: a member declaring a far epoch
    would be asked first every time, and hivemind loads any state at or past the agent's epoch, so the
    agent would jump to it (and the portal refuse its reports as far ahead of the swarm). Among the
    others hivemind's order stands: the agent still loads from a member declaring a little more than
    the swarm (docs/trust.md, "Not defended yet"). The agent's own declaration is no source (hivemind
    skips it) and no part of the median: a latecomer declares epoch 0, and with one member ahead of it
    the median would be its own.

    With an even number of others the lower median is taken, raised up to the upper one when the
    agent's progress tracker reads the swarm that far (``swarm_epoch``, -1 when unread): two agents
    that fell behind together are half of the declarations in a swarm of three, and with the lower
    median alone each could load only the other's state, at its own epoch, and the two stayed there
    (tests/security/test_liar_agents.py saw an honest agent count 26 target batches in one epoch).
    A member declaring a far epoch is still no source unless the tracker, too, reads the swarm there.

    Nor is a member declaring an epoch below the agent's own: hivemind loads from the first source
    that answers and then refuses a state behind the agent's epoch ("Cowardly refusing to load state
    from peer"), without asking the next, so an agent that fell behind the swarm and drew a member
    behind it stayed there, training alone on parameters no validator held."""
    declarations = declared_epochs(declared)
    floor = declarations.get(own, float("-inf"))
    epochs = sorted(epoch for peer, epoch in declarations.items() if peer != own)
    if not epochs:
        return {}
    lower, upper = epochs[(len(epochs) - 1) // 2], epochs[len(epochs) // 2]
    ceiling = max(lower, min(upper, swarm_epoch)) + 1
    return {peer: declared[peer] for peer, epoch in declarations.items() if peer != own and floor <= epoch <= ceiling}


class MembersOnlyStateAverager(EpochStateServing, StateSourceChoice, TrainingStateAverager, MembersOnlyAverager,
                               AggregatingAverager):
    """hivemind's ``TrainingStateAverager`` (parameter averaging every epoch, and state downloads)
    averaging, given the agent's ``authorizer``, only among peers that prove they hold a token, and
    combining each part by the run's ``aggregation``: a member that sends false parameters is
    bounded by CenteredClip there as it is in the gradients' all-reduce (and where a part is left
    with two slices, its owner keeps its own: ``PARAMETERS_RUNNERS``). It keeps the states of its
    peer's last steps for the validator (:class:`EpochStates`)."""

    _rpc_handlers = None  # hivemind collects a class's handlers once; this class adds one to its bases'
    runners = PARAMETERS_RUNNERS
    optimizer_step_skip = False  # set by MembersOnlyOptimizer when this epoch's gradients are not the swarm's

    def step(self, *args, optimizer_step: bool = False, delay_optimizer_step: bool = False, **kwargs):
        if optimizer_step and self.optimizer_step_skip:
            optimizer_step = delay_optimizer_step = False
        self.optimizer_step_skip = False
        return super().step(*args, optimizer_step=optimizer_step, delay_optimizer_step=delay_optimizer_step, **kwargs)

    def _round_watch(self, control: StepControl) -> None:
        # hivemind logs a failed parameter averaging at its status level, hidden unless verbose; the peer then
        # keeps its own parameters, and if they were apart from the others' (a gradient round that came back
        # partial, a state loaded mid-epoch) its next steps are computed off the swarm's state and earn nothing.
        epoch = self.local_epoch
        # hivemind's MPFuture is held only weakly by the process that waits on it: once the step stops waiting
        # (its timeout), the round's failure arrives for a future already collected, and is never told. Held
        # here until it ends (tests/peer_agent/test_averaging_partners.py).
        self._rounds_watched.add(control)

        def told(round_: StepControl) -> None:
            self._rounds_watched.discard(round_)
            if not round_.cancelled() and round_.exception() is not None:
                logger.warning("Parameter averaging at epoch %d failed (%r); this peer keeps its own parameters",
                               epoch, round_.exception())

        control.add_done_callback(told)

    def schedule_step(self, scheduled_time=None, **kwargs):
        if self._epochs_agree:
            # hivemind's Optimizer gathers max(its epoch + 1, the swarm's): a peer a step behind the swarm would
            # gather the epoch of parameters it does not hold. This is the epoch its parameters are at when the
            # round runs, after its step (its epoch is the state averager's).
            kwargs["gather"] = self.local_epoch + 1
        return super().schedule_step(scheduled_time, **kwargs)

    def _epochs_apart(self, group_info) -> list | None:
        """The epochs a group's members gathered, if not all one (an aggregator's left out: it sends no
        parameters); None when they agree or a member's data cannot be read (the membership check refuses it)."""
        epochs = set()
        for gathered in group_info.gathered:
            try:
                _, mode, user_gathered = MSGPackSerializer.loads(gathered)
                gather = MSGPackSerializer.loads(user_gathered)
                if mode != AveragingMode.AUX.value:
                    epochs.add(gather[0] if self._membership is not None else gather)
            except Exception:  # anyone's bytes, and msgpack raises many kinds of errors on garbage
                return None
        return sorted(epochs, key=str) if len(epochs) > 1 else None

    async def _aggregate_with_group(self, group_info, min_vector_size: int, **kwargs):
        apart = self._epochs_apart(group_info) if self._epochs_agree else None
        if apart is not None:
            # Members' streams to this peer wait on the group's future: cancelling it ends them now. Every member
            # reads the same epochs, and refuses alike.
            self._running_groups[group_info.group_id].cancel()
            raise EpochsApart(f"not averaging parameters with this group: its members are at epochs {apart}")
        return await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)

    async def _step(self, **kwargs):
        try:
            await super()._step(**kwargs)
        except EpochsApart:
            pass  # hivemind's _step gave the round this exception: it ends now, where a retry would meet the same

    def __init__(self, *args, epochs_agree: bool = False, **kwargs):
        # Only with members at one epoch (MembersOnlyOptimizer sets it for a trainer): hivemind matches rounds by
        # time, and a round that mixed a member a step behind with the others moved every member to parameters
        # between the two steps, mid-epoch, while the steps the others had already computed were at their own
        # (docs/benchmarks.md, section 17). Read in the averager's process: set before it forks.
        self._epochs_agree = epochs_agree
        self._rounds_watched: set[StepControl] = set()
        # Shared memory, made before hivemind forks the averager's process, which serves from it.
        # In hivemind's order of the main parameters (the groups'), in which states are served.
        groups = kwargs["params"] = [dict(group, params=list(group["params"])) if isinstance(group, dict) else group
                                     for group in kwargs["params"]]
        # The swarm's epoch as the optimizer's tracker last read it, for the state download's choice of sources.
        self.swarm_epoch = multiprocessing.Value("q", -1, lock=False)
        # Bytes of the swarm's state received so far from the peer a download asks: the volunteer's progress bar.
        self.state_received = multiprocessing.Value("q", 0, lock=False)
        # An aggregator (auxiliary) computes no steps: it keeps nothing.
        self.epoch_states = None if kwargs.get("auxiliary") else EpochStates(
            [parameter.shape for group in groups for parameter in (group["params"] if isinstance(group, dict) else [group])])
        super().__init__(*args, **kwargs)

    @classmethod
    def _get_handle_name(cls, namespace, method_name):
        # hivemind names an averager's RPC streams after its class; keeping the name of the class this
        # one extends keeps state downloads working for peers that build a plain TrainingStateAverager
        # (the portal's checkpointer, runs/swarm/checkpoints.py).
        return TrainingStateAverager._get_handle_name(namespace, method_name)

    def state_sources_choose(self, declared: dict) -> dict:
        return state_sources(self.peer_id.to_bytes(), declared, swarm_epoch=self.swarm_epoch.value)

    def parameters_load(self, epoch: int, parameters: Sequence[torch.Tensor]) -> bool:
        """Load a peer's parameters of ``epoch`` (in the order :meth:`rpc_download_parameters` sends them) and
        move to that epoch, keeping this peer's optimizer statistics: hivemind 1.1.12's
        ``TrainingStateAverager.load_state_from_peers`` without them. False, loading nothing, if their shapes
        are not the model's."""
        optimized = [parameter for group in self.optimizer.param_groups for parameter in group["params"]]
        if [parameter.shape for parameter in optimized] != [loaded.shape for loaded in parameters]:
            return False
        with torch.no_grad(), self.lock_averaged_tensors:
            for local, loaded in zip(optimized, parameters, strict=True):
                local.copy_(loaded)
        if self.offload_optimizer:
            self._apply_optimizer_parameters_()
        if not self.reuse_tensors:
            self._load_local_tensors_into_averager_()
        self.local_epoch = epoch
        self._update_scheduler()
        return True

    async def _load_state_from_peers(self, future, timeout=None):
        # Runs in the averager's process: hivemind 1.1.12 asks each source through a stub of get_stub's
        # (hivemind/averaging/averager.py); this one counts what its download stream brings.
        self.get_stub = lambda *args, **kwargs: _CountingStub(type(self).get_stub(*args, **kwargs), self.state_received)
        try:
            return await super()._load_state_from_peers(future, timeout)
        finally:
            del self.get_stub

    def state_size_estimate(self) -> int:
        """About how many bytes a peer sends for this state: the same tensors as this peer's, compressed as the
        run says (hivemind's own estimate of each tensor's compression)."""
        _, tensors, infos = self.get_current_state()
        return int(sum(tensor.numel() * tensor.element_size() * self.state_compression.estimate_compression_ratio(info)
                       for tensor, info in zip(tensors, infos, strict=True)))


class _CountingStub:
    """A state averager's stub whose ``rpc_download_state`` stream adds the bytes of each part to ``received``
    (from 0 for each peer asked)."""

    def __init__(self, stub, received) -> None:
        self._stub, self._received = stub, received

    def __getattr__(self, name: str):
        return getattr(self._stub, name)

    async def rpc_download_state(self, request):
        self._received.value = 0
        stream = await self._stub.rpc_download_state(request)

        async def counted():
            async for message in stream:
                self._received.value += len(message.tensor_part.buffer)
                yield message

        return counted()


class SwarmProgressTracker(ProgressTracker):
    """hivemind's progress tracker, which takes the swarm's epoch from the peers' progress records without
    believing a record more than one epoch past the others'.

    hivemind takes the highest epoch any record claims. A member whose record claims a far epoch makes every
    other peer find itself out of sync after each step: it drops the step, downloads the swarm's state (from
    sources at the swarm's epoch, :func:`state_sources`, so it stays where it was) and does it again at the next
    step; the run stops training. A record is left out when it claims more than one epoch past the median of the
    non-client records (this peer's own among them), as soon as there are three, by a peer at the median: the
    first peer to end an epoch is one past the others. A peer far from the median believes the highest record,
    as hivemind does: one that fell behind, or a restarted agent whose killed self's record lingers for a minute
    beside its partner's (tests/e2e/test_preemption.py), must find the swarm's epoch; it downloads the state from
    sources at the swarm's epoch (:func:`state_sources`), and is at the median then. Between two peers nothing
    tells the liar from the truth."""

    def _parse_swarm_progress_data(self, metadata):
        epochs = [entry.value["epoch"] for entry in metadata.values() if _progress_record(entry)] \
            if isinstance(metadata, dict) else []
        median = statistics.median_low(epochs) if len(epochs) >= 3 else None
        if median is not None and abs(self.local_progress.epoch - median) <= 1:
            metadata = {subkey: entry for subkey, entry in metadata.items()
                        if not _progress_record(entry) or entry.value["epoch"] <= median + 1}
        return super()._parse_swarm_progress_data(metadata)


def _progress_record(entry) -> bool:
    """Whether a progress record (a ``ValueWithExpiration`` of hivemind's schema) is a non-client peer's."""
    value = getattr(entry, "value", None)
    return isinstance(value, dict) and not value.get("client_mode") and isinstance(value.get("epoch"), int) \
        and not isinstance(value.get("epoch"), bool)


class MembersOnlyOptimizer(Optimizer):
    """``hivemind.Optimizer`` whose state averager, given the agent's ``authorizer``, averages
    parameters only among token holders and by the run's ``aggregation`` (pass a
    ``FlooredGradientAverager`` factory with the same authorizer and aggregation for gradients). It
    keeps the authorizer's token fresh while it runs.

    A peer whose gradient round failed does not step on its own gradients, up
    to ``LONE_STEPS_SKIPPED_MAX`` epochs in a row: hivemind would step it on them, off the parameters of
    the swarm, whose step it missed. Its next epoch's steps would then be computed at parameters no
    other peer holds, which the validator cannot check (runs/swarm/spotcheck.py: the epoch earns
    nothing), until a parameter averaging brings it back. Not stepping, it computes that epoch at the
    state the swarm computed the last one at, which the validator holds; two peers whose round failed
    together stay together. Only when gradient averaging is not delayed (``delay_updates``): delayed,
    the step is scheduled before its round's outcome is known."""

    def __init__(self, *args, authorizer: PortalAuthorizer | None = None, aggregation: str = "mean", **kwargs):
        self._authorizer, self._aggregation = authorizer, aggregation
        self.state_loads = 0  # downloads of the swarm's state so far: a step that caused one was dropped
        # Called with the bytes received and the expected total while the swarm's state downloads (the agent's
        # progress bar, peer_agent.display.DownloadProgress); None shows nothing.
        self.state_download_progress: Callable[[int, int], None] | None = None
        self._resync_epoch: int | None = None  # set by a gradient round that held peers of a later epoch
        super().__init__(*args, **kwargs)
        # An aggregator's epoch is only its guess; with delayed updates a round's gradients are an epoch old by design.
        if self.grad_averager is not None and not self.auxiliary and not self.delay_grad_averaging:
            # Each gradient round gathers the epoch its members' gradients are of (_ahead_in_round).
            self.grad_averager.gather_default = lambda: self.local_epoch
        if authorizer is not None:
            # Only now: hivemind has forked the averagers' processes, which need no refresh thread.
            authorizer.token_refresh_start()

    def load_state_from_peers(self, **kwargs) -> None:
        """hivemind's download of the swarm's state, from sources chosen knowing the swarm's epoch as the
        tracker reads it (:func:`state_sources`). hivemind calls it from ``step`` too, when it finds this
        peer out of sync, instead of accumulating that step's gradients (``state_loads`` counts both)."""
        self.state_loads += 1
        if self.state_loads > 1:  # the first is the join's (peer_agent.training says so)
            logger.info("Out of step with the swarm (epoch %d here, %d there): downloading its state",
                        self.local_epoch, self.tracker.global_epoch)
        self._state_download(**kwargs)
        self.catch_up()

    def _state_download(self, **kwargs) -> None:
        self.state_averager.swarm_epoch.value = self.tracker.global_epoch
        if self.state_download_progress is None:
            super().load_state_from_peers(**kwargs)
            return
        progress, received = self.state_download_progress, self.state_averager.state_received
        received.value = 0
        total = self.state_averager.state_size_estimate()
        done, shown = threading.Event(), [0, 0]  # the bytes and the total the bar last showed

        def watch() -> None:
            while not done.wait(PROGRESS_EVERY_S):
                if received.value != shown[0]:
                    shown[:] = received.value, max(total, received.value)
                    progress(*shown)

        watcher = threading.Thread(target=watch, daemon=True, name="state download progress")
        watcher.start()
        try:
            super().load_state_from_peers(**kwargs)
        finally:
            done.set()
            watcher.join()
        if received.value and shown != [received.value, received.value]:  # the last line says 100%, once
            progress(received.value, received.value)

    def catch_up(self) -> None:
        """Load the parameters of the epoch the swarm entered while this peer downloaded its state.

        hivemind's download is the parameters and LAMB's two moments (217 MB at sahajBERT's size): from a
        volunteer's link it can take longer than an epoch, the state then arrives an epoch old, hivemind finds
        the peer out of step at its first step and downloads it all again, and again (docs/benchmarks.md, section
        28: a late joiner at 10 Mbit/s never trained). The parameters alone, a third of it, are asked of a source
        at a later epoch, chosen as the download's are (:func:`state_sources`). The moments stay the downloaded
        ones, an epoch older than the swarm's: each epoch's parameter averaging averages the first
        (peer_agent.training, ``AVERAGED_OPTIMIZER_STATISTICS``), and the second move by a thousandth an epoch."""
        count = sum(parameter.numel() for parameter in self.state_averager.main_parameters)
        # As long as the whole state may take (peer_agent.training.state_download_timeout), for a third of it.
        timeout = min(self.load_state_timeout, CATCH_UP_BASE_S + 32 * count / 1e6)
        silence = self.state_averager.next_chunk_timeout or self.state_averager.request_timeout
        own = self.state_averager.peer_id.to_bytes()
        for _try in range(CATCH_UP_TRIES):
            sources = declared_epochs(state_sources(own, self._declared(), swarm_epoch=self.tracker.global_epoch))
            ahead = sorted(((epoch, peer) for peer, epoch in sources.items() if epoch > self.local_epoch), reverse=True)
            if not ahead:
                return
            for declared_epoch, peer in ahead:
                served = self.state_averager.state_download_from(PeerID(peer).to_base58(), timeout=timeout,
                                                                 silence=silence)
                served_epoch = served[0].get("epoch") if isinstance(served, tuple) else None
                # Not past what the source declared and the choice allowed, but for a step it may have taken since.
                if (isinstance(served_epoch, int) and self.local_epoch < served_epoch <= declared_epoch + 1
                        and self.state_averager.parameters_load(served_epoch, served[1])):
                    logger.info("The swarm moved to epoch %d while this peer downloaded its state: loaded that "
                                "epoch's parameters", served_epoch)
                    break
            else:
                return  # no source served a later epoch: hivemind's next step finds out, as before
            self.tracker.report_local_progress(local_epoch=self.local_epoch, samples_accumulated=0)
            if not self.client_mode:
                self.state_averager.state_sharing_priority = self.local_epoch
                if self.grad_averager is not None:
                    self.grad_averager.state_sharing_priority = self.local_epoch

    def _begin_averaging_gradients(self, grad_scaler) -> bool:
        began = super()._begin_averaging_gradients(grad_scaler)
        # hivemind begins no round when its tracker reads no other peer: stepping alone is all there is.
        if not began and self.tracker.global_progress.num_peers > 1:
            self._lone_step_skip("its gradient round could not begin")
        return began

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control) -> None:
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        if maybe_step_control is None:  # alone in the swarm: stepping alone is all there is
            self._lone_steps_skipped = 0
        elif maybe_step_control.done() and not maybe_step_control.cancelled() and maybe_step_control.exception() is None:
            self._lone_steps_skipped = 0
            ahead = _ahead_in_round(maybe_step_control.result(), self.local_epoch)
            if ahead is not None:
                self._resync_epoch = ahead
        else:
            self._lone_step_skip("its gradient round failed")

    def _update_global_epoch(self, grad_scaler) -> None:
        super()._update_global_epoch(grad_scaler)
        ahead, self._resync_epoch = self._resync_epoch, None
        if ahead is not None and not self.auxiliary:
            self._resync(ahead)

    def _resync(self, ahead: int) -> None:
        """Download the swarm's state after a gradient round that held peers of a later epoch (``ahead``).

        hivemind matches gradient rounds by time, not by epoch: a peer that entered its epoch a few seconds late
        meets the others' round of the next epoch. All step on the same average, so its parameters stay the
        group's, but its epoch stays one behind theirs for good; hivemind's check of the epoch runs once, right after
        each step, when the others have not stepped yet. Every step it computes is then labelled an epoch whose
        state the others left (docs/benchmarks.md, section 17: two honest agents lost eight epochs in a row so), and
        earns nothing (runs/swarm/spotcheck.py). The download waits, briefly, for one of them to declare the state
        it stepped to. Not counted in ``state_loads``: the step that ended the epoch went into the round, and its
        samples count."""
        deadline = time.monotonic() + RESYNC_WAIT_S
        while not self._stepped_source(ahead + 1) and time.monotonic() < deadline:
            time.sleep(RESYNC_POLL_S)
        logger.warning("Epoch %d: this peer's gradient round held peers already at epoch %d; downloading the swarm's "
                       "state, so that its next steps are labelled the swarm's epoch", self.local_epoch, ahead + 1)
        self._state_download()

    def _stepped_source(self, epoch: int) -> bool:
        """Whether another peer declares itself a state source at ``epoch`` or later (hivemind declares a peer's
        epoch again once it has stepped)."""
        own = self.state_averager.peer_id.to_bytes()
        return any(peer != own and served >= epoch for peer, served in declared_epochs(self._declared()).items())

    def _declared(self) -> dict:
        """The state sources' declarations under hivemind's ``{prefix}.all_averagers``, by peer (empty if none)."""
        found = self.dht.get(f"{self.state_averager.prefix}.all_averagers", latest=True)
        return found.value if found is not None and isinstance(found.value, dict) else {}

    def _lone_step_skip(self, why: str) -> None:
        skipped = getattr(self, "_lone_steps_skipped", 0)
        if self.delay_grad_averaging or self.auxiliary or skipped >= LONE_STEPS_SKIPPED_MAX:
            self._lone_steps_skipped = 0
            return
        self._lone_steps_skipped = skipped + 1
        self.state_averager.optimizer_step_skip = True
        logger.warning("Epoch %d: %s; not stepping alone on this peer's own gradients", self.local_epoch, why)

    def _make_progress_tracker(self, target_batch_size: int, **kwargs) -> ProgressTracker:
        if not self.auxiliary:  # hivemind 1.1.12's Optimizer._make_progress_tracker, with the class below
            return SwarmProgressTracker(dht=self.dht, prefix=self.run_id, target_batch_size=target_batch_size,
                                        client_mode=self.client_mode, status_loglevel=self.status_loglevel,
                                        start=True, **kwargs)
        # hivemind 1.1.12's Optimizer._make_progress_tracker, with client_mode=True. An aggregator's
        # progress record says "client": hivemind takes the swarm's epoch from the non-client records, and
        # an aggregator's own guess of when an epoch ends (it computes nothing, so it extrapolates the
        # others' records) would otherwise lead the swarm: every early epoch it announced made the
        # trainers end theirs at once, with a fraction of the batch.
        return SwarmProgressTracker(dht=self.dht, prefix=self.run_id, target_batch_size=target_batch_size,
                                    client_mode=True, status_loglevel=self.status_loglevel, start=True, **kwargs)

    def _make_state_averager(self, **kwargs) -> TrainingStateAverager:
        # hivemind's own method names its class inline: the same arguments as hivemind 1.1.12's
        # Optimizer._make_state_averager (hivemind/optim/optimizer.py), plus the authorizer.
        return MembersOnlyStateAverager(
            dht=self.dht,
            prefix=f"{self.run_id}_state_averager",
            min_matchmaking_time=self.matchmaking_time,
            allreduce_timeout=self.allreduce_timeout,
            shutdown_timeout=self.shutdown_timeout,
            offload_optimizer=self.offload_optimizer,
            custom_gradients=self.offload_optimizer,
            status_loglevel=self.status_loglevel,
            next_chunk_timeout=self.next_chunk_timeout,
            client_mode=self.client_mode,
            auxiliary=self.auxiliary,
            start=True,
            authorizer=self._authorizer,
            aggregation=self._aggregation,
            # Delayed updates step one epoch late by design (peer_agent.training.optimizer_build): not there.
            epochs_agree=not self.auxiliary and not self.delay_optimizer_step,
            **kwargs,
        )

    def shutdown(self):
        try:
            super().shutdown()
        finally:
            if self._authorizer is not None:
                self._authorizer.token_refresh_stop()
