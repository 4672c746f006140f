"""Verified credit: the service that moves a session's epoch between credit states (docs/trust.md has the
rules and their reasons).

For every closed collaboration epoch the coordinator's monitor compares what a session *reported* (its
contribution events with that ``local_epoch``) with what its peer *announced* in its signed DHT records,
and records the outcome in a :class:`~runs.models.SessionEpoch` row:

- verified: spot-checked (with ``verification.spot_checks`` on), ``reported <= announced × (1 + TOLERANCE)``
  plus one local step, and the announced share within ``RUN_PACE_SLACK`` × the target batch plus one step;
- flagged: the figures disagree, or a spot check failed (``failures_to_suspend`` of them suspend the
  session, :func:`check_record`); an organizer accepts or rejects it;
- rejected: an epoch never seen in the DHT (after ``NEVER_SEEN_REJECT_AFTER`` or once its session ended), a
  claim never judged after ``PENDING_MAX_AGE`` (:func:`pending_expire`), an epoch without a commitment, one
  the validator could not check, or one computed at parameters other than the held state's ("diverged").

Each epoch stands on its own checks. Decided rows are final; a verified row is judged again when late
reports arrive. Every change sets ``checked_at`` or ``decided_at``, by which the credit rollup picks rows up.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Min, OuterRef, Q, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.models import Notification, User
from accounts.notifications import notify
from runs.access.sessions import LIVE_SESSION_SEEN_WITHIN
from runs.credit.rollup import watermark_lock
from runs.models import (
    NEVER_CONFIRMED,
    NEVER_SEEN,
    NO_STATE_HELD,
    ContributionEvent,
    Run,
    RunEvent,
    RunSample,
    SessionEpoch,
    StepCommitment,
    TrainingSession,
)
from runs.setup.compute import RUN_PACE_SLACK, SWARM_EPOCH_AHEAD
from runs.setup.services import run_event_record

TOLERANCE = 0.05
NEVER_SEEN_REJECT_AFTER = datetime.timedelta(minutes=10)
NOT_SEEN_YET = "not seen in the DHT yet"
AWAITING_CHECK = "waiting for a spot check of the session's steps"
AWAITING_COUNT = "waiting for the peer's own count of the epoch, which its signed metrics record publishes"
NO_COMMITMENT = "no commitment: the session never committed to the steps of this epoch, so they cannot be checked"
# Claims the monitor has not judged this long after they were reported are rejected, unless their
# epoch is the swarm's current one (a slow epoch is still gathering samples).
PENDING_MAX_AGE = datetime.timedelta(hours=6)
# The audit log's kinds for an organizer's decision on a flag.
EVENT_CREDIT_ACCEPTED, EVENT_CREDIT_REJECTED = RunEvent.Kind.CREDIT_ACCEPTED, RunEvent.Kind.CREDIT_REJECTED
_Status = SessionEpoch.Status
_Outcome = StepCommitment.Outcome


class CreditError(Exception):
    """A decision that does not apply to the row (e.g. accepting an epoch that is not flagged)."""


@dataclass(frozen=True)
class EpochLimits:
    """What one epoch of a run allows a single session to announce and report."""

    target_batch_size: int
    step_samples: int  # one local step of one peer: the slack for a step counted around a resync
    tolerance: float = TOLERANCE

    @classmethod
    def for_run(cls, run: Run, micro_batch_size: int | None = None) -> EpochLimits:
        """The run's limits for a session whose micro-batches hold ``micro_batch_size`` samples (the run's if None)."""
        training = run.configuration.training
        return cls(training.target_batch_size,
                   (micro_batch_size or training.per_device_batch_size) * training.gradient_accumulation_steps)


@dataclass(frozen=True)
class SpotStanding:
    """What spot checks say about one session's epoch: ``check`` is "off" (the run does not spot-check),
    "missing" (no commitment), or the commitment's outcome."""

    check: str
    committed: int = 0
    detail: str = ""


SPOT_CHECKS_OFF = SpotStanding("off")


def spot_standing(*, session_id: int, epoch: int, spot_checks: bool) -> SpotStanding:
    if not spot_checks:
        return SPOT_CHECKS_OFF
    commitment = StepCommitment.objects.filter(session_id=session_id, epoch=epoch).first()
    if commitment is None:
        return SpotStanding("missing")
    return SpotStanding(commitment.outcome, committed=commitment.samples, detail=commitment.check_detail)


def epoch_assess(*, epoch: int, reported: int, announced: int | None, limits: EpochLimits,
                 spot: SpotStanding = SPOT_CHECKS_OFF, announced_final: bool = True) -> tuple[str, str]:
    """The status the figures call for (verified, flagged, or provisional when never seen, not
    checked yet, or reported past a count that may still grow) and why."""
    if spot.check == _Outcome.FAILED:
        return _Status.FLAGGED, spot.detail or f"epoch {epoch}: a spot check failed"
    if spot.check in (_Outcome.DIVERGED, _Outcome.UNCHECKED):
        return _Status.REJECTED, spot.detail
    if announced is None:
        return _Status.PROVISIONAL, NOT_SEEN_YET
    if announced > RUN_PACE_SLACK * limits.target_batch_size + limits.step_samples:
        return _Status.FLAGGED, (f"epoch {epoch}: the peer announced {announced} samples, more than one peer gathers "
                                 f"in an epoch ({RUN_PACE_SLACK:g} × the target batch of {limits.target_batch_size})")
    allowed = int(announced * (1 + limits.tolerance)) + limits.step_samples
    if reported > allowed and not announced_final:
        # A peer publishes its count of an epoch after the first step of the next, which waits for the
        # averaging round: a progress record read before then can be short of what it reported.
        return _Status.PROVISIONAL, AWAITING_COUNT
    if reported > allowed:
        return _Status.FLAGGED, (f"epoch {epoch}: reported {reported} samples, but the peer's signed DHT records "
                                 f"announced {announced} (at most {allowed} allowed)")
    if spot.check == "off":
        return _Status.VERIFIED, ""
    if spot.check == "missing":  # nothing reported, nothing to check
        return (_Status.VERIFIED, "") if reported == 0 else (_Status.PROVISIONAL, NO_COMMITMENT)
    if reported > spot.committed + limits.step_samples:
        return _Status.FLAGGED, (f"epoch {epoch}: reported {reported} samples, but committed to steps of "
                                 f"{spot.committed} samples")
    if spot.check == _Outcome.PASSED:
        return _Status.VERIFIED, ""
    return _Status.PROVISIONAL, AWAITING_CHECK


def reported_samples(*, session_ids: list[int] | None = None, run: Run | None = None, epoch: int) -> dict[int, int]:
    """Samples each session reported for ``epoch``, summed from its contribution events now."""
    events = ContributionEvent.objects.filter(local_epoch=epoch)
    events = events.filter(session_id__in=session_ids) if session_ids is not None else events.filter(session__run=run)
    return dict(events.values_list("session").annotate(total=Sum("samples")).values_list("session", "total"))


def announced_record(*, session_id: int, epoch: int, announced: int, final: bool = True) -> None:
    """Keep the largest sample count a session's peer announced for a closed epoch, before it is judged;
    ``final`` when it is the peer's own count of the closed epoch rather than a progress record's."""
    with transaction.atomic():
        row, created = SessionEpoch.objects.select_for_update().get_or_create(
            session_id=session_id, epoch=epoch, defaults={"announced_samples": announced, "announced_final": final})
        if created or row.status != _Status.PROVISIONAL:
            return
        if row.announced_samples is None:  # the row was made for a report before any record was seen
            row.announced_final = final
        grown, now_final = (row.announced_samples or 0) < announced, final and not row.announced_final
        if grown or now_final:
            row.announced_samples = max(row.announced_samples or 0, announced)
            row.announced_final = row.announced_final or final
            row.save(update_fields=["announced_samples", "announced_final"])


def epoch_judge(*, run: Run, epoch: int, closed_at: datetime.datetime, session_ids: list[int] | None = None) -> dict[int, str]:
    """Judge a closed epoch for the sessions that reported samples or were seen in it (or only
    ``session_ids``), with the announced figures :func:`announced_record` stored. Returns the
    status of each session's row."""
    reported = reported_samples(session_ids=session_ids, run=run, epoch=epoch)
    stored = SessionEpoch.objects.filter(session__run=run, epoch=epoch)
    if session_ids is not None:
        stored = stored.filter(session_id__in=session_ids)
    known = dict(stored.values_list("session_id", "announced_samples"))
    counted = set(stored.filter(announced_final=True).values_list("session_id", flat=True))
    sessions = set(reported) | set(known)
    if session_ids is not None:
        sessions &= set(session_ids)
    # Each session's per-step slack follows its own micro-batch (an agent's --per-device-batch-size).
    micro_batch_sizes = dict(TrainingSession.objects.filter(pk__in=sessions).values_list("pk", "micro_batch_size"))
    limits = {size: EpochLimits.for_run(run, size) for size in set(micro_batch_sizes.values()) | {None}}
    # A session's figures are final once it has been over for as long as a silent one takes to be ended
    # (sessions_close_silent): a killed agent's last records are in the DHT still, and the monitor reads them
    # on its next polls. A restart that replaces its session (JoinRequest.replaces_session) ends it sooner.
    ended = set(TrainingSession.objects.filter(pk__in=sessions, ended_at__lte=timezone.now() - LIVE_SESSION_SEEN_WITHIN)
                .values_list("pk", flat=True))
    suspended = set(TrainingSession.objects.filter(pk__in=sessions, suspended_at__isnull=False).values_list("pk", flat=True))
    spot_checks = run.configuration.verification.spot_checks
    outcome = {}
    for session_id in sorted(sessions):
        outcome[session_id] = _session_epoch_judge(
            session_id=session_id, epoch=epoch, reported=reported.get(session_id, 0), announced=known.get(session_id),
            limits=limits[micro_batch_sizes.get(session_id)],
            spot=spot_standing(session_id=session_id, epoch=epoch, spot_checks=spot_checks),
            give_up=session_id in ended or timezone.now() - closed_at >= NEVER_SEEN_REJECT_AFTER,
            suspended=session_id in suspended, counted=session_id in counted)
    return outcome


@transaction.atomic
def _session_epoch_judge(*, session_id: int, epoch: int, reported: int, announced: int | None, limits: EpochLimits,
                         give_up: bool, spot: SpotStanding = SPOT_CHECKS_OFF, suspended: bool = False,
                         counted: bool = True) -> str:
    row, _ = SessionEpoch.objects.select_for_update().get_or_create(session_id=session_id, epoch=epoch)
    if row.status in (_Status.ACCEPTED, _Status.REJECTED):
        return row.status  # an organizer's decision, or a final "never seen", is not revisited
    # Past the wait (the session ended, or 10 minutes since the epoch closed) the figures seen are final.
    status, detail = epoch_assess(epoch=epoch, reported=reported, announced=announced, limits=limits, spot=spot,
                                  announced_final=counted or give_up)
    if suspended and status == _Status.VERIFIED:  # as session_suspend did to the epochs judged before it
        status, detail = _Status.FLAGGED, f"epoch {epoch}: session suspended by spot checks"
    if status == _Status.REJECTED:
        # The evidence decides, even for an epoch flagged before it came (a suspension flags every epoch of
        # the session): steps computed off the swarm's state, or committed to too late to be checked, earn
        # nothing, and an organizer accepting the flag would have credited them (seen in CI: a liar's dark
        # epoch, flagged by its suspension, then committed to late).
        epoch_reject_unseen(row=row, reported=reported, detail=detail)
        return row.status
    if status == _Status.PROVISIONAL and row.status != _Status.PROVISIONAL:
        return row.status  # judged on a record that has since expired from memory: keep the verdict
    if (row.status, row.reported_samples, row.announced_samples) == (status, reported, announced) and row.checked_at:
        return row.status  # nothing new: a restarted monitor does not judge twice
    if row.status == _Status.FLAGGED and (row.reported_samples, row.announced_samples) == (reported, announced):
        return row.status  # flagged on these figures: a reading that would pass now does not unflag it, nor reflag it
    if status == _Status.FLAGGED or row.status == _Status.FLAGGED:
        # Once flagged, new figures update the flag; only an organizer takes it off. A suspended
        # session's volunteer was told once, by the suspension.
        epoch_flag(row=row, reported=reported, announced=announced, detail=detail or row.detail, notice=not suspended)
    elif status == _Status.VERIFIED:
        epoch_verify(row=row, reported=reported, announced=announced)
    elif give_up and reported and detail in (NOT_SEEN_YET, NO_COMMITMENT):
        epoch_reject_unseen(row=row, reported=reported, detail=NEVER_SEEN if detail == NOT_SEEN_YET else NO_COMMITMENT)
    elif (row.reported_samples, row.detail) != (reported, detail):
        _save(row, reported_samples=reported, detail=detail)
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


def epoch_flag(*, row: SessionEpoch, reported: int, announced: int | None, detail: str, notice: bool = True) -> None:
    """Provisional, verified or flagged → flagged, with the figures for the organizer; the volunteer
    is told when the epoch is newly flagged (unless `notice` is off: a suspension tells them once)."""
    if row.status not in (_Status.PROVISIONAL, _Status.VERIFIED, _Status.FLAGGED):
        raise CreditError(f"a {row.status} epoch cannot be flagged")
    if notice and row.status != _Status.FLAGGED:
        _credit_notice(row.session_id, Notification.Kind.CREDIT_FLAGGED, f"epoch-flagged:{row.pk}", epoch=row.epoch)
    _save(row, status=_Status.FLAGGED, reported_samples=reported, announced_samples=announced, detail=detail[:500],
          checked_at=timezone.now())


def _credit_notice(session_id: int, kind: str, key: str, **context) -> None:
    session = TrainingSession.objects.select_related("user", "run").get(pk=session_id)
    notify(user=session.user, kind=kind, key=key,
           context={"run": session.run.name, "url": session.run.get_absolute_url(), **context})


def epoch_reject_unseen(*, row: SessionEpoch, reported: int, detail: str = NEVER_SEEN) -> None:
    """Provisional → rejected: the session's peer never appeared in the DHT for the epoch, it never
    committed to the epoch's steps, it computed them away from the collaboration's parameters, or their
    commitment could not be checked. Verified → rejected too: an epoch verified while it held nothing
    to check (no samples reported yet) whose samples and commitment came later. Flagged → rejected for
    the last two: no organizer's decision can make such steps the swarm's."""
    if row.status not in (_Status.PROVISIONAL, _Status.VERIFIED, _Status.FLAGGED):
        raise CreditError(f"a {row.status} epoch cannot be rejected as never seen")
    _save(row, status=_Status.REJECTED, reported_samples=reported, detail=detail, checked_at=timezone.now())


def disagreeing_sessions(*, run: Run) -> list[TrainingSession]:
    """The run's sessions whose peer served the validator a state unlike the one two peers agreed on
    (runs/swarm/spotcheck.py), the most such states first."""
    return list(run.sessions.filter(states_disagreed__gt=0).select_related("user")
                .order_by("-states_disagreed", "-started_at")[:500])


def suspended_sessions(*, run: Run) -> list[TrainingSession]:
    """The run's sessions that spot checks suspended, waiting for an organizer."""
    return list(run.sessions.filter(suspended_at__isnull=False).select_related("user").order_by("suspended_at")[:500])


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
        raise CreditError(_("epoch %(epoch)d of this session is %(status)s, not flagged: nothing to decide")
                          % {"epoch": locked.epoch, "status": locked.get_status_display()})
    _save(locked, status=status, decided_by=by, decided_at=timezone.now())
    session = locked.session
    _credit_notice(session.pk, Notification.Kind.CREDIT_DECIDED, f"epoch-decided:{locked.pk}", epoch=locked.epoch,
                   accepted=status == _Status.ACCEPTED)
    run_event_record(run=session.run, actor=by, kind=kind, detail=(
        f"{status} {session.user.username}'s epoch {locked.epoch} (session {session.pk}): "
        f"reported {locked.reported_samples}, announced {locked.announced_samples}; {locked.detail}"))
    row.refresh_from_db()


def pending_expire(*, now: datetime.datetime | None = None) -> int:
    """Reject the claims reported over ``PENDING_MAX_AGE`` ago that are still provisional: epochs
    the swarm closed (the monitor would have judged them if it could), and epochs far ahead of the
    swarm or of a run the monitor no longer reads. The swarm's current epoch waits. Events are
    taken once, in id order, behind a watermark. Returns the session epochs rejected."""
    now = now or timezone.now()
    rejected = 0
    with transaction.atomic():
        mark = watermark_lock()
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



# --- spot checks: what the coordinator's validator (runs/swarm/spotcheck.py) records ------------------

def commitments_to_check(*, run: Run, epochs: set[int]) -> list[StepCommitment]:
    """The run's commitments not checked yet for the epochs whose state the validator holds, oldest first:
    those not queued for a validator worker, or whose worker was lost (:func:`_queue_lost_before`)."""
    pending = StepCommitment.objects.filter(
        Q(queued_at__isnull=True) | Q(queued_at__lt=_queue_lost_before()), session__run=run, outcome=_Outcome.PENDING,
        epoch__in=epochs, session__suspended_at__isnull=True)
    return list(pending.select_related("session").order_by("epoch", "id")[:500])


def _queue_lost_before() -> datetime.datetime:
    """A check queued for a validator worker before this and not recorded lost its worker (it died with the
    message, or the broker did): the validator queues it again, and a retry that finds it recorded does
    nothing (runs/swarm/recompute.py)."""
    return timezone.now() - datetime.timedelta(seconds=settings.SPOT_CHECK_REQUEUE_SECONDS)


def flags_settle(*, run: Run) -> int:
    """Judge again the flagged epochs whose commitment was judged off the swarm's state or unchecked after
    the flag: the evidence rejects them (:func:`_session_epoch_judge`). A commitment stored unchecked at the
    door (late, or reaching beyond the session's work: runs/ingest/reports.py) goes through no check that
    would judge its epoch: CI saw a suspended liar's late commitment arrive in the seconds before the
    ingest refused its session, after the suspension had flagged the epoch. Returns how many."""
    off_the_swarm = StepCommitment.objects.filter(session_id=OuterRef("session_id"), epoch=OuterRef("epoch"),
                                                  outcome__in=(_Outcome.DIVERGED, _Outcome.UNCHECKED))
    flagged = list(SessionEpoch.objects.filter(session__run=run, status=_Status.FLAGGED)
                   .filter(Exists(off_the_swarm)).values_list("session_id", "epoch"))
    for session_id, epoch in flagged:
        _rejudge(run=run, session_id=session_id, epochs=[epoch])
    return len(flagged)


def commitments_uncheckable(*, run: Run, before_epoch: int) -> int:
    """Pending commitments for epochs before ``before_epoch``, which the validator no longer holds (or
    never did): marked unchecked and their epochs judged again. A check queued for a validator worker waits
    for it, unless its worker was lost: the states it needs are kept. Returns how many."""
    stale = list(StepCommitment.objects.filter(session__run=run, outcome=_Outcome.PENDING, epoch__lt=before_epoch)
                 .exclude(queued_at__gte=_queue_lost_before()))
    for commitment in stale:
        _outcome_save(commitment, _Outcome.UNCHECKED, detail=NO_STATE_HELD.format(epoch=commitment.epoch))
        _rejudge(run=run, session_id=commitment.session_id, epochs=[commitment.epoch])
    return len(stale)


def check_record(*, commitment: StepCommitment, distances: dict[int, float], tolerance: float,
                 failures_to_suspend: int, diverged: dict[int, float] | None = None) -> str:
    """Record a spot check: ``distances``, the fingerprint distances of the drawn steps by cursor, all
    claimed at the held state; ``diverged``, every micro-batch the session says it computed elsewhere,
    with how far its parameters were from the held state's (compared for every step, drawn or not).

    - A drawn step beyond ``tolerance``: failed, the epoch flagged with the figures and, at
      ``failures_to_suspend`` failures, the session suspended. A step computed elsewhere beside it
      shields nothing.
    - Else any step computed elsewhere: diverged, the epoch rejected, nothing held against the session.
      Whether that step was drawn does not matter: it earns nothing either way.
    - Else: passed, and the epoch is judged again (it vouches for no other)."""
    session = commitment.session
    run = session.run
    diverged = diverged or {}
    checked = [[cursor, distance] for cursor, distance in sorted(distances.items())]
    failed = {cursor: distance for cursor, distance in distances.items() if distance > tolerance}
    if failed:
        worst_cursor, worst = max(failed.items(), key=lambda item: item[1])
        detail = (f"epoch {commitment.epoch}: spot check failed: the step at micro-batch {worst_cursor} recomputed "
                  f"{worst:.3f} away from its committed fingerprint (tolerance {tolerance:g}); "
                  f"{len(distances)} step(s) checked")
        _outcome_save(commitment, _Outcome.FAILED, detail=detail, checked_steps=checked)
        epoch_judge(run=run, epoch=commitment.epoch, closed_at=timezone.now(), session_ids=[session.pk])
        failures = StepCommitment.objects.filter(session=session, outcome=_Outcome.FAILED).count()
        if failures >= failures_to_suspend and session.suspended_at is None:
            session_suspend(session=session, reason=f"{failures} spot checks failed; the last: {detail}")
        return _Outcome.FAILED
    if diverged:
        worst_cursor, worst = max(diverged.items(), key=lambda item: item[1])
        detail = (f"epoch {commitment.epoch}: {len(diverged)} of {len(commitment.steps)} micro-batches were computed "
                  f"at parameters other than the collaboration's (up to {worst:.3f} away, at micro-batch "
                  f"{worst_cursor}; its averaging round had failed, most likely): work off the swarm's state cannot "
                  f"be checked, and the epoch earns nothing")
        _outcome_save(commitment, _Outcome.DIVERGED, detail=detail, checked_steps=checked)
        epoch_judge(run=run, epoch=commitment.epoch, closed_at=timezone.now(), session_ids=[session.pk])
        return _Outcome.DIVERGED
    _outcome_save(commitment, _Outcome.PASSED, detail="", checked_steps=checked)
    _rejudge(run=run, session_id=session.pk, epochs=[commitment.epoch])
    return _Outcome.PASSED


@transaction.atomic
def session_suspend(*, session: TrainingSession, reason: str) -> None:
    """Refuse the session's reports and send all of its epochs to the organizer: credit from a
    session caught faking work counts only where an organizer accepts it."""
    newly = TrainingSession.objects.filter(pk=session.pk, suspended_at=None).exists()
    TrainingSession.objects.filter(pk=session.pk).update(suspended_at=timezone.now(), suspension_reason=reason[:500])
    session.refresh_from_db()
    for row in SessionEpoch.objects.select_for_update().filter(
            session=session, status__in=(_Status.PROVISIONAL, _Status.VERIFIED)):
        epoch_flag(row=row, reported=row.reported_samples, announced=row.announced_samples,
                   detail=f"epoch {row.epoch}: session suspended by spot checks: {reason}", notice=False)
    # An epoch whose commitment was judged off the swarm before the suspension earns nothing, flagged or not.
    _rejudge(run=session.run, session_id=session.pk, epochs=list(StepCommitment.objects.filter(
        session=session, outcome__in=(_Outcome.DIVERGED, _Outcome.UNCHECKED)).values_list("epoch", flat=True)))
    if newly:  # suspended again with a new reason: the volunteer was told already
        _credit_notice(session.pk, Notification.Kind.SESSION_SUSPENDED,
                       f"session-suspended:{session.pk}:{session.suspended_at.isoformat()}", session=session.pk)
    run_event_record(run=session.run, actor=None, kind=RunEvent.Kind.SUSPENDED,
                     detail=f"{session.user.username}'s session {session.pk}: {reason}")


@transaction.atomic
def session_unsuspend(*, session: TrainingSession, by: User) -> None:
    """An organizer lifts a suspension: the session may report again; its flagged epochs still wait
    for decisions."""
    if session.suspended_at is None:
        raise CreditError(_("session %(session)d is not suspended") % {"session": session.pk})
    TrainingSession.objects.filter(pk=session.pk).update(suspended_at=None, suspension_reason="")
    session.refresh_from_db()
    run_event_record(run=session.run, actor=by, kind=RunEvent.Kind.UNSUSPENDED,
                     detail=f"{session.user.username}'s session {session.pk}")


def _outcome_save(commitment: StepCommitment, outcome: str, *, detail: str, checked_steps: list | None = None) -> None:
    commitment.outcome, commitment.check_detail, commitment.checked_at = outcome, detail[:500], timezone.now()
    fields = ["outcome", "check_detail", "checked_at"]
    if checked_steps is not None:
        commitment.checked_steps = checked_steps
        fields.append("checked_steps")
    commitment.save(update_fields=fields)


def _rejudge(*, run: Run, session_id: int, epochs: list[int]) -> None:
    """Judge a session's epochs again now that a check changed what they rest on; an epoch the
    monitor has not closed yet waits for it, unless a suspension flagged it: a commitment judged off the
    swarm rejects it now (CI44: a suspended liar's dark epoch, never closed, stayed flagged)."""
    closed = SessionEpoch.objects.filter(session_id=session_id, epoch__in=epochs).exclude(
        Q(announced_samples__isnull=True) & ~Q(status=_Status.FLAGGED)).values_list("epoch", flat=True)
    for epoch in sorted(set(closed)):
        epoch_judge(run=run, epoch=epoch, closed_at=timezone.now(), session_ids=[session_id])
