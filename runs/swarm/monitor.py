"""The coordinator's monitor: reads a run's signed DHT records, writes the run's series and
verifies the sessions' credit (:mod:`runs.credit.verification`).

Every poll reads the peers' progress records (``{run_id}_progress``, hivemind's tracker) and
metrics records (``{run_id}_metrics``, :mod:`peer_agent.metrics`), both signed with the peer key
the portal issued the session's access token for, and

- writes one :class:`~runs.models.RunSample` (its ``at`` is the monitor's last good poll, which
  the run's health page reads);
- keeps, per peer and epoch, the largest sample count the peer announced for the epoch: the
  progress record's ``samples_accumulated`` (reset every epoch, so the monitor polls several
  times per epoch) and the metrics record a peer publishes when its epoch ends, which holds the
  full counts of the peer's last 16 epochs when polls missed the progress records' last values;
- once the collaboration's epoch has moved past an epoch, stores those figures in the sessions'
  :class:`~runs.models.SessionEpoch` rows, and after ``grace_s`` (late reports arrive) judges them.

Nothing the monitor needs after a restart lives only in memory: the announced figures are in the
rows, epochs it had not judged yet are judged again, and judging twice changes nothing.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass

from django.db.models import Max
from django.utils import timezone
from hivemind.dht import DHT
from hivemind.dht.schema import SchemaValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress, TrainingProgressSchema
from hivemind.p2p import PeerID

from peer_agent.metrics import LocalMetrics, metrics_read, signed_records_read
from runs.credit import verification
from runs.models import ContributionEvent, Run, RunSample, SessionEpoch, TrainingSession

logger = logging.getLogger(__name__)

GRACE_S = 30.0  # after an epoch closes, time for the agents' last reports of it to arrive
RECHECK_UNSEEN_S = 30.0  # how often an epoch with sessions not seen in the DHT is judged again
LATE_REPORT_OVERLAP = datetime.timedelta(seconds=5)
_OWNER_PREFIX, _OWNER_SUFFIX = b"[owner:", b"]"


def progress_key(run_id: str) -> str:
    return f"{run_id}_progress"


def progress_validators(run_id: str) -> list:
    """What a DHT needs besides an RSASignatureValidator to read a run's progress records."""
    return [SchemaValidator(TrainingProgressSchema, prefix=run_id)]


def progress_read(dht: DHT, run_id: str) -> dict[bytes, LocalTrainingProgress]:
    """Every peer's latest progress record, by owner subkey; cleared or malformed records are skipped."""
    return signed_records_read(dht, progress_key(run_id), LocalTrainingProgress)


def peer_key_text(subkey: bytes) -> str | None:
    """The peer's public key as TrainingSession.peer_public_key holds it (OpenSSH text), from a
    signed record's subkey ``[owner:ssh-rsa ...]``."""
    if not (subkey.startswith(_OWNER_PREFIX) and subkey.endswith(_OWNER_SUFFIX)):
        return None
    return subkey[len(_OWNER_PREFIX):-len(_OWNER_SUFFIX)].decode("ascii", errors="replace")


@dataclass(frozen=True)
class SwarmReading:
    """The collaboration at one poll, as the run's series records it."""

    global_epoch: int | None  # None while no peer publishes progress
    samples_per_second: float
    alive_peers: int
    client_peers: int
    samples_accumulated: int  # toward the next epoch, over the peers in the global epoch
    loss: float | None  # mean of the peers' latest reported losses


def swarm_reading(progress: dict[bytes, LocalTrainingProgress], metrics: dict[bytes, LocalMetrics]) -> SwarmReading:
    """Summarize the records the way hivemind's tracker does: client-mode peers do not decide the epoch.
    The loss is that of the peers in the swarm now (those with a progress record): a peer that left keeps
    its last metrics record for 10 minutes, and after a pause the old sessions' losses would be averaged
    with the new ones' (runs/swarm/checkpoints.py, ``swarm_reading_of``)."""
    records = list(progress.values())
    full = [record.epoch for record in records if not record.client_mode]
    epoch = max(full or [record.epoch for record in records], default=None)
    present = [record for subkey, record in metrics.items() if subkey in progress]
    latest_step = max((m.step for m in present), default=None)
    losses = [m.loss for m in present if m.step == latest_step]
    return SwarmReading(
        global_epoch=epoch,
        samples_per_second=sum(record.samples_per_second for record in records),
        alive_peers=len(records),
        client_peers=sum(record.client_mode for record in records),
        samples_accumulated=sum(record.samples_accumulated for record in records if record.epoch == epoch),
        loss=sum(losses) / len(losses) if losses else None,
    )


def announcements(progress: dict[bytes, LocalTrainingProgress], metrics: dict[bytes, LocalMetrics],
                  known_epochs: dict[bytes, set[int]]) -> dict[tuple[bytes, int], int]:
    """Samples each peer announced per epoch in these records: a progress record counts toward its
    epoch; a metrics record names the counts of the peer's last epochs (``closed_epochs``), or, from
    an agent older than that field, covers the epoch the peer was in before its step ``s`` (the
    latest one the monitor saw it in, else ``s - 1``)."""
    found: dict[tuple[bytes, int], int] = {}

    def keep(subkey: bytes, epoch: int, samples: int) -> None:
        found[subkey, epoch] = max(found.get((subkey, epoch), 0), samples)

    for subkey, record in progress.items():
        keep(subkey, record.epoch, record.samples_accumulated)
    for subkey, record in metrics.items():
        for epoch, samples in record.closed_epochs:
            keep(subkey, epoch, samples)
        if not record.closed_epochs and record.step > 0 and record.samples_accumulated > 0:
            earlier = [epoch for epoch in known_epochs.get(subkey, ()) if epoch < record.step]
            keep(subkey, max(earlier, default=record.step - 1), record.samples_accumulated)
    return found


def counted_epochs(metrics: dict[bytes, LocalMetrics]) -> set[tuple[bytes, int]]:
    """The (peer, epoch) pairs whose full count a metrics record holds (``closed_epochs``): what the peer
    itself counted once the epoch closed, where a progress record may have been read before its end."""
    return {(subkey, epoch) for subkey, record in metrics.items() for epoch, _ in record.closed_epochs}


class Monitor:
    """Reads one run's swarm through the backbone peer's DHT; :meth:`poll` once every few seconds."""

    def __init__(self, *, dht: DHT, run_pk: int, run_id: str, grace_s: float | None = None) -> None:
        self.dht, self.run_pk, self.run_id = dht, run_pk, run_id
        self.grace_s = GRACE_S if grace_s is None else grace_s
        dht.add_validators(progress_validators(run_id))
        self.announced: dict[tuple[bytes, int], int] = {}  # (peer subkey, epoch) → samples, until judged
        self.counted: set[tuple[bytes, int]] = set()  # (peer subkey, epoch) whose figure is the peer's own count
        self.stored: dict[tuple[int, int], tuple[int, bool]] = {}  # (session, epoch) → the row's figure, and final
        self.sessions: dict[bytes, int | None] = {}
        # A peer's libp2p id (base58) -> its session, from the peer id its signed progress records name; None
        # when two sessions name it. Replaced whole on each poll: the validator's holder thread reads it.
        self.peer_sessions: dict[str, int | None] = {}
        self.global_epoch: int | None = None
        # Closed epochs not judged for good: when they closed and when to judge them.
        self.closed_at: dict[int, datetime.datetime] = {}
        self.due: dict[int, float] = {}
        # After a restart: epochs with provisional rows, judged once the swarm is seen past them.
        rows = SessionEpoch.objects.filter(session__run_id=run_pk)
        self.unjudged = set(rows.filter(status=SessionEpoch.Status.PROVISIONAL).values_list("epoch", flat=True))
        now = timezone.now()
        figures = rows.exclude(status=SessionEpoch.Status.PROVISIONAL).aggregate(epoch=Max("epoch"), at=Max("checked_at"))
        self.judged_through: int = figures["epoch"] if figures["epoch"] is not None else -1
        self.reports_seen_at: datetime.datetime = figures["at"] or now
        self.last_poll_at: datetime.datetime | None = None

    def poll(self) -> SwarmReading:
        """Read the records, write the run's sample, store and judge closed epochs."""
        progress, metrics = progress_read(self.dht, self.run_id), metrics_read(self.dht, self.run_id)
        reading = swarm_reading(progress, metrics)
        RunSample.objects.create(
            run_id=self.run_pk, global_epoch=reading.global_epoch or self.global_epoch or 0,
            samples_per_second=reading.samples_per_second, alive_peers=reading.alive_peers,
            client_peers=reading.client_peers, samples_accumulated=reading.samples_accumulated, loss=reading.loss)
        self._announcements_add(progress, metrics)
        self._peer_sessions_add(progress)
        if reading.global_epoch is not None:
            self._epochs_close(reading.global_epoch)
        self._store_closed()
        self._judge_due()
        self._judge_late_reports()
        self.last_poll_at = timezone.now()
        return reading

    def _announcements_add(self, progress, metrics) -> None:
        known: dict[bytes, set[int]] = {}
        for subkey, epoch in self.announced:
            known.setdefault(subkey, set()).add(epoch)
        for (subkey, epoch), samples in announcements(progress, metrics, known).items():
            # Records outlive their epoch: skip the ones judged already.
            if epoch > self.judged_through or epoch in self.due or epoch in self.unjudged:
                self.announced[subkey, epoch] = max(self.announced.get((subkey, epoch), 0), samples)
        self.counted |= counted_epochs(metrics) & set(self.announced)

    def _epochs_close(self, global_epoch: int) -> None:
        first = self.judged_through + 1 if self.global_epoch is None else max(self.global_epoch, self.judged_through + 1)
        closing = set(range(first, global_epoch)) if self.global_epoch is not None else set()
        closing |= {epoch for _, epoch in self.announced if epoch < global_epoch}
        closing |= {epoch for epoch in self.unjudged if epoch < global_epoch}
        self.unjudged -= closing
        for epoch in closing - set(self.closed_at):
            self.closed_at[epoch], self.due[epoch] = timezone.now(), time.monotonic() + self.grace_s
        self.global_epoch = max(global_epoch, self.global_epoch or 0)

    def _peer_sessions_add(self, progress: dict[bytes, LocalTrainingProgress]) -> None:
        peer_sessions = dict(self.peer_sessions)
        for subkey, record in progress.items():
            try:
                peer = PeerID(record.peer_id).to_base58()
            except Exception:  # a record naming no valid peer id names no peer
                continue
            session = self._session_of(subkey)
            if session is None:
                continue
            # A session may name another's peer id in its own record: then neither is told apart by it.
            peer_sessions[peer] = session if peer_sessions.get(peer, session) == session else None
        self.peer_sessions = peer_sessions

    def peer_session(self, peer: str) -> int | None:
        """The session whose signed progress records name the libp2p ``peer`` (base58), if exactly one does."""
        return self.peer_sessions.get(peer)

    def _session_of(self, subkey: bytes) -> int | None:
        if subkey not in self.sessions:
            key = peer_key_text(subkey)
            session = TrainingSession.objects.filter(run_id=self.run_pk, peer_public_key=key).order_by("-started_at").first()
            self.sessions[subkey] = session.pk if session else None
        return self.sessions[subkey]

    def _store_closed(self) -> None:
        """Write the announced figures of closed epochs to their rows (only when they grew or became final)."""
        for (subkey, epoch), samples in self.announced.items():
            session, final = self._session_of(subkey), (subkey, epoch) in self.counted
            if epoch not in self.closed_at or session is None:
                continue
            if self.stored.get((session, epoch), (-1, False)) < (samples, final):
                verification.announced_record(session_id=session, epoch=epoch, announced=samples, final=final)
                self.stored[session, epoch] = samples, final

    def _judge_due(self) -> None:
        for epoch in sorted(epoch for epoch, due in self.due.items() if due <= time.monotonic()):
            outcome = verification.epoch_judge(run=self._run(), epoch=epoch, closed_at=self.closed_at[epoch])
            logger.info("run %s: epoch %d judged: %s", self.run_id, epoch, outcome)
            self.judged_through = max(self.judged_through, epoch)
            if SessionEpoch.Status.PROVISIONAL in outcome.values():
                self.due[epoch] = time.monotonic() + RECHECK_UNSEEN_S  # a session not seen in the DHT (yet)
                continue
            del self.due[epoch], self.closed_at[epoch]
            self.announced = {key: value for key, value in self.announced.items() if key[1] != epoch}
            self.counted = {key for key in self.counted if key[1] != epoch}
            self.stored = {key: value for key, value in self.stored.items() if key[1] != epoch}

    def _judge_late_reports(self) -> None:
        """Reports that arrived after their epoch was judged: judge those sessions' epochs again."""
        # An event is stored a moment after its received_at: look back a little; judging twice changes nothing.
        since, until = self.reports_seen_at - LATE_REPORT_OVERLAP, timezone.now()
        late = (ContributionEvent.objects.filter(session__run_id=self.run_pk, received_at__gte=since,
                                                 local_epoch__lte=self.judged_through)
                .values_list("local_epoch", "session_id").distinct())
        by_epoch: dict[int, list[int]] = {}
        for epoch, session in late:
            if epoch not in self.due:
                by_epoch.setdefault(epoch, []).append(session)
        for epoch, sessions in sorted(by_epoch.items()):
            verification.epoch_judge(run=self._run(), epoch=epoch, closed_at=timezone.now(), session_ids=sessions)
        self.reports_seen_at = until

    def _run(self) -> Run:
        return Run.objects.get(pk=self.run_pk)
