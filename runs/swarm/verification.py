"""Verified credit: the service that moves a session's epoch between credit states.

A session's reports are claims. For every closed collaboration epoch the coordinator's monitor
compares what a session *reported* (the sum of its contribution events with that ``local_epoch``)
with what its peer *announced* in its signed DHT records for that epoch, and records the outcome
in a :class:`~runs.models.SessionEpoch` row:

- verified: ``reported <= announced × (1 + TOLERANCE) + one local step`` and the announced share
  is plausible: at most ``RUN_PACE_SLACK`` × the epoch's ``target_batch_size`` + one local step,
  the same pace the ingest allows. An honest peer does go past the target batch: it accumulates
  into its epoch until its fetch of the collaboration's progress returns or its averaging round
  begins (seen in CI: 48 samples of a target of 32). The slack of one step covers the step an
  agent counts when hivemind drops it for a resync.
- flagged: the figures disagree; ``detail`` names them and an organizer accepts or rejects it.
- provisional, "never seen": the session reported samples for an epoch in which the monitor never
  saw its peer's records. It is rejected once its session has ended or ``NEVER_SEEN_REJECT_AFTER``
  passed after the epoch closed, since no record can arrive any more.
- pending for good: claims the monitor never judged (the epoch closed while the coordinator was
  down, or lies far ahead of the swarm) are rejected ``PENDING_MAX_AGE`` after they were reported
  (:func:`pending_expire`), so that no claim stays pending for ever.

Rows that an organizer decided (accepted, rejected) are final. A verified row is judged again
when late reports arrive; it stays verified if the new sum still agrees, else it is flagged.
Every change sets ``checked_at`` or ``decided_at``: the credit rollup picks rows up by them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Min, Sum
from django.utils import timezone

from accounts.models import User
from peer_agent.protocol import RunConfig
from runs.ingest.reports import RUN_PACE_SLACK
from runs.models import ContributionEvent, Run, RunEvent, SessionEpoch, TrainingSession
from runs.setup.services import run_event_record

TOLERANCE = 0.05
NEVER_SEEN_REJECT_AFTER = datetime.timedelta(minutes=10)
NEVER_SEEN = "never seen in the DHT: no signed progress record of this session's peer for the epoch"
NOT_SEEN_YET = "not seen in the DHT yet"
# Claims the monitor has not judged this long after they were reported are rejected, unless their
# epoch is the swarm's current one (a slow epoch is still gathering samples).
PENDING_MAX_AGE = datetime.timedelta(hours=6)
NEVER_CONFIRMED = "not confirmed within 6 h of its report: no signed record of this session's peer was judged for the epoch"
# The audit log's kinds for an organizer's decision on a flag.
EVENT_CREDIT_ACCEPTED, EVENT_CREDIT_REJECTED = RunEvent.Kind.CREDIT_ACCEPTED, RunEvent.Kind.CREDIT_REJECTED
_Status = SessionEpoch.Status


class CreditError(Exception):
    """A decision that does not apply to the row (e.g. accepting an epoch that is not flagged)."""


@dataclass(frozen=True)
class EpochLimits:
    """What one epoch of a run allows a single session to announce and report."""

    target_batch_size: int
    step_samples: int  # one local step of one peer: the slack for a step counted around a resync
    tolerance: float = TOLERANCE

    @classmethod
    def for_run(cls, run: Run) -> EpochLimits:
        training = RunConfig.model_validate(run.config).training
        return cls(training.target_batch_size, training.per_device_batch_size * training.gradient_accumulation_steps)


def epoch_assess(*, epoch: int, reported: int, announced: int | None, limits: EpochLimits) -> tuple[str, str]:
    """The status the figures call for (verified, flagged, or provisional when never seen) and why."""
    if announced is None:
        return _Status.PROVISIONAL, NOT_SEEN_YET
    if announced > RUN_PACE_SLACK * limits.target_batch_size + limits.step_samples:
        return _Status.FLAGGED, (f"epoch {epoch}: the peer announced {announced} samples, more than one peer gathers "
                                 f"in an epoch ({RUN_PACE_SLACK:g} × the target batch of {limits.target_batch_size})")
    allowed = int(announced * (1 + limits.tolerance)) + limits.step_samples
    if reported > allowed:
        return _Status.FLAGGED, (f"epoch {epoch}: reported {reported} samples, but the peer's signed DHT records "
                                 f"announced {announced} (at most {allowed} allowed)")
    return _Status.VERIFIED, ""


def reported_samples(*, session_ids: list[int] | None = None, run: Run | None = None, epoch: int) -> dict[int, int]:
    """Samples each session reported for ``epoch``, summed from its contribution events now."""
    events = ContributionEvent.objects.filter(local_epoch=epoch)
    events = events.filter(session_id__in=session_ids) if session_ids is not None else events.filter(session__run=run)
    return dict(events.values_list("session").annotate(total=Sum("samples")).values_list("session", "total"))


def announced_record(*, session_id: int, epoch: int, announced: int) -> None:
    """Keep the largest sample count a session's peer announced for a closed epoch, before it is judged."""
    with transaction.atomic():
        row, created = SessionEpoch.objects.select_for_update().get_or_create(
            session_id=session_id, epoch=epoch, defaults={"announced_samples": announced})
        if not created and row.status == _Status.PROVISIONAL and (row.announced_samples or 0) < announced:
            row.announced_samples = announced
            row.save(update_fields=["announced_samples"])


def epoch_judge(*, run: Run, epoch: int, closed_at: datetime.datetime, session_ids: list[int] | None = None) -> dict[int, str]:
    """Judge a closed epoch for the sessions that reported samples or were seen in it (or only
    ``session_ids``), with the announced figures :func:`announced_record` stored. Returns the
    status of each session's row."""
    limits = EpochLimits.for_run(run)
    reported = reported_samples(session_ids=session_ids, run=run, epoch=epoch)
    stored = SessionEpoch.objects.filter(session__run=run, epoch=epoch)
    if session_ids is not None:
        stored = stored.filter(session_id__in=session_ids)
    known = dict(stored.values_list("session_id", "announced_samples"))
    sessions = set(reported) | set(known)
    if session_ids is not None:
        sessions &= set(session_ids)
    ended = set(TrainingSession.objects.filter(pk__in=sessions, ended_at__isnull=False).values_list("pk", flat=True))
    outcome = {}
    for session_id in sorted(sessions):
        outcome[session_id] = _session_epoch_judge(
            session_id=session_id, epoch=epoch, reported=reported.get(session_id, 0), announced=known.get(session_id),
            limits=limits,
            give_up=session_id in ended or timezone.now() - closed_at >= NEVER_SEEN_REJECT_AFTER)
    return outcome


@transaction.atomic
def _session_epoch_judge(*, session_id: int, epoch: int, reported: int, announced: int | None, limits: EpochLimits,
                         give_up: bool) -> str:
    row, _ = SessionEpoch.objects.select_for_update().get_or_create(session_id=session_id, epoch=epoch)
    if row.status in (_Status.ACCEPTED, _Status.REJECTED):
        return row.status  # an organizer's decision, or a final "never seen", is not revisited
    status, detail = epoch_assess(epoch=epoch, reported=reported, announced=announced, limits=limits)
    if status == _Status.PROVISIONAL and row.status != _Status.PROVISIONAL:
        return row.status  # judged on a record that has since expired from memory: keep the verdict
    if (row.status, row.reported_samples, row.announced_samples) == (status, reported, announced) and row.checked_at:
        return row.status  # nothing new: a restarted monitor does not judge twice
    if status == _Status.FLAGGED or row.status == _Status.FLAGGED:
        # Once flagged, new figures update the flag; only an organizer takes it off.
        epoch_flag(row=row, reported=reported, announced=announced, detail=detail or row.detail)
    elif status == _Status.VERIFIED:
        epoch_verify(row=row, reported=reported, announced=announced)
    elif give_up and reported:
        epoch_reject_unseen(row=row, reported=reported)
    elif (row.reported_samples, row.detail) != (reported, NOT_SEEN_YET):
        _save(row, reported_samples=reported, detail=NOT_SEEN_YET)
    return row.status


def _save(row: SessionEpoch, **fields) -> None:
    for name, value in fields.items():
        setattr(row, name, value)
    row.save(update_fields=list(fields))


def epoch_verify(*, row: SessionEpoch, reported: int, announced: int) -> None:
    """Provisional (or verified with older figures) → verified."""
    if row.status not in (_Status.PROVISIONAL, _Status.VERIFIED):
        raise CreditError(f"a {row.status} epoch cannot become verified")
    _save(row, status=_Status.VERIFIED, reported_samples=reported, announced_samples=announced, detail="",
          checked_at=timezone.now())


def epoch_flag(*, row: SessionEpoch, reported: int, announced: int | None, detail: str) -> None:
    """Provisional, verified or flagged → flagged, with the figures for the organizer."""
    if row.status not in (_Status.PROVISIONAL, _Status.VERIFIED, _Status.FLAGGED):
        raise CreditError(f"a {row.status} epoch cannot be flagged")
    _save(row, status=_Status.FLAGGED, reported_samples=reported, announced_samples=announced, detail=detail[:500],
          checked_at=timezone.now())


def epoch_reject_unseen(*, row: SessionEpoch, reported: int) -> None:
    """Provisional → rejected: the session's peer never appeared in the DHT for the epoch."""
    if row.status != _Status.PROVISIONAL:
        raise CreditError(f"a {row.status} epoch cannot be rejected as never seen")
    _save(row, status=_Status.REJECTED, reported_samples=reported, detail=NEVER_SEEN, checked_at=timezone.now())


def flags_for_run(*, run: Run) -> list[SessionEpoch]:
    """The run's flagged epochs waiting for an organizer, oldest first, with their volunteers."""
    flagged = SessionEpoch.objects.filter(session__run=run, status=_Status.FLAGGED)
    return list(flagged.select_related("session__user").order_by("epoch", "id")[:500])


@transaction.atomic
def flag_accept(*, row: SessionEpoch, by: User) -> None:
    """An organizer accepts a flagged epoch: its reported samples count as verified."""
    _flag_decide(row=row, by=by, status=_Status.ACCEPTED, kind=EVENT_CREDIT_ACCEPTED)


@transaction.atomic
def flag_reject(*, row: SessionEpoch, by: User) -> None:
    """An organizer rejects a flagged epoch: it earns no credit."""
    _flag_decide(row=row, by=by, status=_Status.REJECTED, kind=EVENT_CREDIT_REJECTED)


def _flag_decide(*, row: SessionEpoch, by: User, status: str, kind: str) -> None:
    locked = SessionEpoch.objects.select_for_update().select_related("session__run", "session__user").get(pk=row.pk)
    if locked.status != _Status.FLAGGED:
        raise CreditError(f"epoch {locked.epoch} of this session is {locked.status}, not flagged: nothing to decide")
    _save(locked, status=status, decided_by=by, decided_at=timezone.now())
    session = locked.session
    run_event_record(run=session.run, actor=by, kind=kind, detail=(
        f"{status} {session.user.username}'s epoch {locked.epoch} (session {session.pk}): "
        f"reported {locked.reported_samples}, announced {locked.announced_samples}; {locked.detail}"))
    row.refresh_from_db()


def pending_expire(*, now: datetime.datetime | None = None) -> int:
    """Reject the claims reported over ``PENDING_MAX_AGE`` ago that are still provisional: epochs
    the swarm closed (the monitor would have judged them if it could), and epochs far ahead of the
    swarm or of a run the monitor no longer reads. The swarm's current epoch waits. Events are
    taken once, in id order, behind a watermark. Returns the session epochs rejected."""
    from runs.ingest.reports import SWARM_EPOCH_AHEAD
    from runs.models import CreditRollup, RunSample

    now = now or timezone.now()
    rejected = 0
    with transaction.atomic():
        CreditRollup.objects.get_or_create(pk=1)
        mark = CreditRollup.objects.select_for_update().get(pk=1)
        old = ContributionEvent.objects.filter(id__gt=mark.pending_event_id, received_at__lt=now - PENDING_MAX_AGE)
        upper = old.order_by("-id").values_list("id", flat=True).first()
        if upper is None:
            return 0
        claims = (ContributionEvent.objects.filter(id__gt=mark.pending_event_id, id__lte=upper)
                  .values_list("session__run_id", "session_id", "local_epoch").annotate(first=Min("id")))
        swarm_epochs: dict[int, int | None] = {}
        waiting = []  # the first events of claims that wait: the watermark stays before them
        for run_id, session_id, epoch, first in claims:
            if run_id not in swarm_epochs:
                reading = RunSample.objects.filter(run_id=run_id, at__gte=now - PENDING_MAX_AGE).order_by("-at")
                swarm_epochs[run_id] = reading.values_list("global_epoch", flat=True).first()
            swarm = swarm_epochs[run_id]
            if swarm is not None and swarm <= epoch <= swarm + SWARM_EPOCH_AHEAD:
                waiting.append(first)  # the swarm's current epoch, or one it is about to reach
                continue
            rejected += _pending_reject(session_id=session_id, epoch=epoch, now=now)
        mark.pending_event_id = min(waiting) - 1 if waiting else upper
        mark.save(update_fields=["pending_event_id"])
    return rejected


def _pending_reject(*, session_id: int, epoch: int, now: datetime.datetime) -> int:
    row, _ = SessionEpoch.objects.select_for_update().get_or_create(session_id=session_id, epoch=epoch)
    if row.status != _Status.PROVISIONAL:
        return 0
    reported = reported_samples(session_ids=[session_id], epoch=epoch).get(session_id, 0)
    _save(row, status=_Status.REJECTED, reported_samples=reported, detail=NEVER_CONFIRMED, checked_at=now)
    return 1

