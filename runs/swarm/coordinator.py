"""The run coordinator: for every active run, a stable hivemind backbone peer whose addresses are
among the run's `initial_peers`, a heartbeat that organizers see, and the run's duties: its monitor
(runs.swarm.monitor), checkpointer and spot-check validator; and, when the run's organizers ask for it
(``averaging.backbone_aggregates``), an aggregator beside each backbone peer.

A run may have several backbone peers, from coordinators on several hosts (docs/deploy.md): every
one of them is an initial peer of every join, and one at a time holds the duties, on a lease it
renews each cycle; when its coordinator dies, another takes them over once the lease lapses."""

import datetime
import functools
import json
import logging
import socket
import threading
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone
from hivemind.dht import DHT
from hivemind.p2p import PeerID
from hivemind.utils.crypto import RSAPrivateKey

from peer_agent.aggregator import Aggregator
from peer_agent.authorizer import PortalAuthorizer, rsa_public_key_parse
from peer_agent.metrics import dht_result, metrics_validators
from peer_agent.protocol import access_username
from peer_agent.reachability import dialback_install, relay_options
from peer_agent.tokenizer import tokenizer_load
from peer_agent.training import TrainerSetup
from portal.logs import log_context
from runs.access.authority import access_token_sign, authority_load
from runs.models import Backbone, Run
from runs.swarm.checkpoints import Checkpointer
from runs.swarm.monitor import Monitor
from runs.swarm.spotcheck import Validator

logger = logging.getLogger(__name__)
COORDINATOR_USERNAME = "coordinator"
AGGREGATOR_STEP_S = 0.1  # how often the aggregator looks whether a round is due (peer_agent.aggregate does the same)


def aggregator_access_sign(*, authority, peer_public_key: bytes) -> dict:
    """A backbone aggregator's hivemind access token: the run's authority signs it as it signs every
    session's, naming the aggregator role (``coordinator#aggregator``)."""
    return access_token_sign(private_key=authority, username=access_username(COORDINATOR_USERNAME, "aggregator"),
                             peer_public_key=peer_public_key,
                             lifetime=datetime.timedelta(minutes=settings.HIVEMIND_ACCESS_MINUTES))


class BackboneAggregator:
    """The run's aggregator on a backbone peer's host (``averaging.backbone_aggregates``): a second peer
    that enters the swarm through the backbone peer and joins every gradient round and parameter averaging
    in hivemind's auxiliary mode (``peer_agent.aggregator``), declaring COORDINATOR_AGGREGATOR_BANDWIDTH_MBPS
    to the partition.

    Its access token is signed by the run's authority as every session's is (``access_token_sign`` with
    ``access_username``, runs/access/sessions.py), naming the aggregator role, so authorizers and
    membership proofs treat it as an organizer's aggregator. It opens no session: it reports no samples
    and earns no credit. A thread of its own steps it, since the coordinator's cycle blocks for seconds."""

    def __init__(self, run: Run, *, authority, initial_peers: list[str]) -> None:
        key = RSAPrivateKey()  # its own: the backbone peer's progress records must not be overwritten
        fetch_token = functools.partial(aggregator_access_sign, authority=authority,
                                        peer_public_key=key.get_public_key().to_bytes())

        setup = TrainerSetup(
            config=run.configuration, run_id=run.hivemind_run_id, initial_peers=initial_peers,
            bandwidth=float(settings.COORDINATOR_AGGREGATOR_BANDWIDTH_MBPS), private_key=key,
            authorizer=PortalAuthorizer(key, rsa_public_key_parse(run.authority_public_key), fetch_token),
            host_maddrs=settings.COORDINATOR_AGGREGATOR_HOST_MADDRS,
            announce_maddrs=settings.COORDINATOR_AGGREGATOR_ANNOUNCE_MADDRS or None,
        )
        tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
        self.aggregator = Aggregator(setup, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
        self.peer_id = str(self.aggregator.dht.peer_id)
        self.rounds = 0  # gradient rounds it took its part in
        self._state_groups_logged = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"aggregator-{run.slug}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.wait(AGGREGATOR_STEP_S):
            try:
                group = self.aggregator.step()
            except Exception:  # a failed round must not end the aggregator: the next epoch brings another
                logger.exception("aggregator %s: a gradient round failed", self.peer_id)
                continue
            if group:
                self.rounds += 1
                logger.info("aggregator %s: averaged gradients in a group of %d peers at epoch %d", self.peer_id,
                            group, self.aggregator.local_epoch)
            elif group is not None:
                logger.info("aggregator %s: the round of epoch %d went on without it", self.peer_id,
                            self.aggregator.local_epoch)
            for group in self.aggregator.state_groups[self._state_groups_logged:]:
                if group:
                    logger.info("aggregator %s: averaged parameters in a group of %d peers", self.peer_id, group)
                else:
                    logger.info("aggregator %s: a parameter averaging went on without it", self.peer_id)
            self._state_groups_logged = len(self.aggregator.state_groups)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.aggregator.dht.is_alive()

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)  # a step returns at once; this waits out the one under way
        self.aggregator.shutdown()


class BackbonePeer:
    """One run's DHT peer: keeps the swarm reachable and, while it holds the run's duties, hosts the
    run's monitor, checkpointer and spot-check validator."""

    def __init__(self, run: Run, *, state_dir: Path, host_maddrs: list[str], announce_maddrs: list[str] | None) -> None:
        self.run_pk, self.slug, self.run_id = run.pk, run.slug, run.hivemind_run_id
        self.authority = authority = authority_load(encrypted=run.authority_private_key,
                                                    secret=settings.AUTHORITY_ENCRYPTION_KEY)
        self.private_key = RSAPrivateKey()
        lifetime = datetime.timedelta(minutes=settings.HIVEMIND_ACCESS_MINUTES)
        public_key = self.private_key.get_public_key().to_bytes()

        def fetch_token() -> dict:
            # Runs in the DHT's forked process: signs with the key loaded above, never the database.
            return access_token_sign(private_key=authority, username=COORDINATOR_USERNAME, peer_public_key=public_key,
                                     lifetime=lifetime)

        authorizer = PortalAuthorizer(self.private_key, rsa_public_key_parse(run.authority_public_key), fetch_token)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.swarm_file = state_dir / f"{self.run_id}.swarm"
        identity_path = state_dir / f"{self.run_id}.identity"
        dht_options = dict(
            ensure_bootstrap_success=False,
            host_maddrs=host_maddrs,
            announce_maddrs=announce_maddrs,
            identity_path=str(identity_path),  # same peer id after a restart
            authorizer=authorizer,
            record_validators=metrics_validators(self.run_id, self.private_key),
            startup_timeout=120,
            # Relays for agents behind NAT (the daemon relays whenever relaying is on), and a dial-back
            # service that tells them whether they are reachable: peer_agent.reachability.
            **relay_options([], relayed=False),
        )
        # The run's other backbone peers are a way in as well as the peers this one remembers.
        others = _not_own(run.initial_peers, identity_path)
        self.dht = _dht_start(self.slug, self.swarm_file, dht_options, others=others)
        dialback_install(self.dht)
        self.peer_id = str(self.dht.peer_id)
        self.maddrs = [str(maddr) for maddr in self.dht.get_visible_maddrs()]
        self.host = socket.gethostname()
        self.holds_duties = False
        logger.info("run %s: backbone peer %s at %s", self.slug, self.peer_id, ", ".join(self.maddrs))
        self.monitor = Monitor(dht=self.dht, run_pk=self.run_pk, run_id=self.run_id)
        self.checkpointer = Checkpointer(run_pk=self.run_pk, run_id=self.run_id, slug=self.slug, dht=self.dht)
        self.validator = Validator(run_pk=self.run_pk, run_id=self.run_id, slug=self.slug, dht=self.dht,
                                   checkpointer=self.checkpointer, session_of_peer=self.monitor.peer_session)
        self.aggregator: BackboneAggregator | None = None
        self._rounds_before = 0  # rounds of the aggregators this peer ran before the current one

    @property
    def aggregator_rounds(self) -> int:
        return self._rounds_before + (self.aggregator.rounds if self.aggregator else 0)

    def aggregator_sync(self, run: Run) -> None:
        """Run an aggregator while the run is active and its organizers want one, and stop it otherwise
        (a pause, the option turned off) or when it died (a new one starts at the next cycle)."""
        wanted = (run.status == Run.Status.ACTIVE and run.tokenizer_status == Run.TokenizerStatus.READY
                  and run.configuration.averaging.backbone_aggregates)
        if self.aggregator is not None and not (wanted and self.aggregator.alive()):
            self._aggregator_stop()
        if wanted and self.aggregator is None:
            try:
                self.aggregator = BackboneAggregator(run, authority=self.authority, initial_peers=self.maddrs)
            except Exception:  # a busy host's p2p daemon may not start in time: the next cycle tries again
                logger.exception("run %s: the backbone peer's aggregator did not start", self.slug)
                return
            logger.info("run %s: aggregator %s joins the gradient rounds beside backbone peer %s", self.slug,
                        self.aggregator.peer_id, self.peer_id)

    def _aggregator_stop(self) -> None:
        aggregator, self.aggregator = self.aggregator, None
        self._rounds_before += aggregator.rounds
        logger.info("run %s: aggregator %s stops, after %d gradient rounds", self.slug, aggregator.peer_id,
                    aggregator.rounds)
        aggregator.shutdown()

    def heartbeat(self) -> None:
        """Tell the portal the backbone peer is up, so that joins name its addresses (while its DHT lives)."""
        if not self.dht.is_alive():
            raise RuntimeError(f"run {self.slug}: the backbone peer's DHT process has died")
        now = timezone.now()
        Backbone.objects.update_or_create(run_id=self.run_pk, peer_id=self.peer_id, defaults=dict(
            maddrs=self.maddrs, host=self.host, heartbeat_at=now, aggregates=self.aggregator is not None,
            aggregator_rounds=self.aggregator_rounds))
        Run.objects.filter(pk=self.run_pk).update(coordinator_heartbeat_at=now)
        initial_peers_publish(run_pk=self.run_pk, now=now)

    def duties_hold(self) -> bool:
        """Take the run's duties when no live peer holds them, or renew this peer's hold."""
        now = timezone.now()
        lease = datetime.timedelta(seconds=settings.COORDINATOR_DUTIES_LEASE_SECONDS)
        free = Q(coordinator_peer_id=self.peer_id) | Q(duties_until__lt=now) | Q(duties_until=None)
        held = bool(Run.objects.filter(Q(pk=self.run_pk) & free).update(coordinator_peer_id=self.peer_id,
                                                                        duties_until=now + lease))
        if held != self.holds_duties:
            logger.info("run %s: backbone peer %s %s the run's monitor, checkpoints and spot checks", self.slug,
                        self.peer_id, "takes on" if held else "leaves another backbone peer")
        self.holds_duties = held
        return held

    def tick(self, stopping: threading.Event | None = None) -> None:
        """One cycle: heartbeat; then, while this peer holds the run's duties (renewed before each),
        checkpoints, spot checks and the monitor's poll. A stop asked meanwhile skips the rest (it
        must end within seconds, docs/deploy.md)."""
        for duty in (self.heartbeat, self._swarm_peers_save):
            if stopping is not None and stopping.is_set():
                return
            duty()
        for duty in (self.checkpointer.tick, self.validator.tick, self._monitor_poll):
            if (stopping is not None and stopping.is_set()) or not self.duties_hold():
                return
            duty()

    def _swarm_peers_save(self) -> None:
        try:
            # With a timeout: a coroutine the DHT process drops would otherwise block the cycle for good.
            connected = dht_result(self.dht, self.dht.run_coroutine(_connected_maddrs, return_future=True))
            swarm_peers_save(self.swarm_file, connected)
        except Exception:  # only a restart would miss it
            logger.exception("run %s: could not save the swarm's addresses", self.slug)

    def _monitor_poll(self) -> None:
        try:
            self.monitor.poll()
        except Exception:  # a failed poll must not stop the heartbeat; the health page sees no new sample
            logger.exception("run %s: monitor poll failed", self.slug)

    def shutdown(self) -> None:
        logger.info("run %s: backbone peer stopping", self.slug)
        if self.aggregator is not None:
            try:
                self._aggregator_stop()
            except Exception:  # the backbone peer must still leave
                logger.exception("run %s: the aggregator did not stop cleanly", self.slug)
        try:
            # Joins stop naming this peer at once, not only when its heartbeat goes stale, and another
            # backbone peer may take the duties over at its next cycle.
            Backbone.objects.filter(run_id=self.run_pk, peer_id=self.peer_id).delete()
            Run.objects.filter(pk=self.run_pk, coordinator_peer_id=self.peer_id).update(duties_until=None)
            initial_peers_publish(run_pk=self.run_pk, now=timezone.now())
        except Exception:  # the database may be the reason for the stop; the heartbeat goes stale then
            logger.warning("run %s: could not withdraw the backbone peer's addresses", self.slug, exc_info=True)
        try:
            self.validator.shutdown()
            self.checkpointer.shutdown()
        finally:
            self.dht.shutdown()


def initial_peers_publish(*, run_pk: int, now: datetime.datetime) -> None:
    """The run's initial peers: the addresses of its live backbone peers, the oldest first."""
    stale = now - datetime.timedelta(seconds=settings.COORDINATOR_HEARTBEAT_STALE_SECONDS)
    maddrs = Backbone.objects.filter(run_id=run_pk, heartbeat_at__gte=stale).values_list("maddrs", flat=True)
    Run.objects.filter(pk=run_pk).update(initial_peers=list(dict.fromkeys(maddr for peer in maddrs for maddr in peer)))


def _not_own(maddrs: list[str], identity_path: Path) -> list[str]:
    """``maddrs`` without this peer's own (from before a restart): libp2p refuses to dial itself."""
    if not identity_path.exists():
        return list(maddrs)
    own = str(PeerID.from_identity(identity_path.read_bytes()))
    return [maddr for maddr in maddrs if not maddr.endswith(f"/p2p/{own}")]


def _dht_start(slug: str, swarm_file: Path, options: dict, others: list[str]) -> DHT:
    """The backbone peer's DHT, entering the swarm through the peers it was connected to before and
    the run's other backbone peers.

    A restarted peer (perhaps on another port) knows nobody, and the agents dropped it from their
    routing tables: it reaches them again through those peers. When none of them answers (the swarm
    emptied while it was down) the p2p daemon refuses to start at all, whatever
    ``ensure_bootstrap_success`` says: then the remembered peers are forgotten and the peer starts a
    swarm of its own, which agents join and load the run's state into from its newest checkpoint.
    """
    remembered = swarm_peers_load(swarm_file)
    known = list(dict.fromkeys(others + remembered))
    if known:
        try:
            return DHT(start=True, initial_peers=known, **options)
        except Exception as exc:  # P2PDaemonError, or a timeout: whatever it is, a fresh swarm is the way on
            logger.warning("run %s: none of the %d peers the backbone peer knew answered (%s); starting a fresh swarm",
                           slug, len(known), str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            swarm_file.unlink(missing_ok=True)
    return DHT(start=True, initial_peers=[], **options)


async def _connected_maddrs(dht: DHT, node) -> list[str]:
    """Runs in the DHT's process: the full multiaddrs of the peers the backbone peer is connected to."""
    return sorted(f"{maddr}/p2p/{info.peer_id}" for info in await node.p2p.list_peers() for maddr in info.addrs)


def swarm_peers_load(path: Path) -> list[str]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def swarm_peers_save(path: Path, maddrs: list[str]) -> None:
    if maddrs and maddrs != swarm_peers_load(path):
        path.write_text(json.dumps(maddrs))


class Coordinator:
    """Keeps one backbone peer per active (or paused) run, picking up and letting go as runs change."""

    def __init__(self, *, slug: str | None = None, interval: float = 5.0, state_dir: Path | None = None) -> None:
        self.slug, self.interval = slug, interval
        self.state_dir = state_dir or Path(settings.COORDINATOR_STATE_DIR)
        self.peers: dict[int, BackbonePeer] = {}
        self.stopping = threading.Event()

    def runs_to_serve(self) -> list[Run]:
        runs = Run.objects.filter(status__in=[Run.Status.ACTIVE, Run.Status.PAUSED])
        return list(runs.filter(slug=self.slug) if self.slug else runs)

    def sync(self) -> None:
        close_old_connections()
        wanted = {run.pk: run for run in self.runs_to_serve()}
        dead = {pk for pk, peer in self.peers.items() if not peer.dht.is_alive()}
        for pk in (set(self.peers) - set(wanted)) | dead:
            self._shutdown(self.peers.pop(pk))
        for pk, run in wanted.items():
            if self.stopping.is_set():  # leave the other runs' work to the next start
                return
            with log_context(run=run.slug):  # the run's slug on every log line of its peer, monitor and checkpointer
                if pk not in self.peers:
                    self.peers[pk] = BackbonePeer(
                        run, state_dir=self.state_dir, host_maddrs=settings.COORDINATOR_HOST_MADDRS,
                        announce_maddrs=settings.COORDINATOR_ANNOUNCE_MADDRS or None,
                    )
                self.peers[pk].aggregator_sync(run)
                self.peers[pk].tick(self.stopping)

    @staticmethod
    def _shutdown(peer: BackbonePeer) -> None:
        with log_context(run=peer.slug):
            peer.shutdown()

    def cycle(self) -> None:
        """One sync; a failed one (a database restart, a locked table) is logged and retried next time."""
        try:
            self.sync()
        except Exception:  # one bad cycle must not end the coordinator
            logger.exception("coordinator cycle failed; retrying in %.0f s", self.interval)

    def serve(self) -> None:
        logger.info("coordinator started for %s", f"run {self.slug}" if self.slug else "all active runs")
        try:
            while not self.stopping.is_set():
                self.cycle()
                self.stopping.wait(self.interval)
        finally:
            for peer in self.peers.values():
                self._shutdown(peer)
            self.peers.clear()
            logger.info("coordinator stopped")
