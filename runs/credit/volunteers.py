"""A volunteer's public record: the runs they joined, their credit, and their contribution over time."""

import datetime

from django.db.models import BigIntegerField, Case, F, Max, Q, Sum, Value, When
from django.db.models.functions import Coalesce, Least, TruncDate
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from accounts.models import User
from runs.access.rules import run_may_view
from runs.access.sessions import LIVE_SESSION_SEEN_WITHIN
from runs.credit.rollup import rac_now, run_credit_per_sample
from runs.models import (
    NEVER_CONFIRMED,
    NEVER_SEEN,
    NO_STATE_HELD,
    ContributionEvent,
    CreditHour,
    Milestone,
    Run,
    RunCredit,
    SessionEpoch,
    StepCommitment,
    TrainingSession,
    epoch_confirmed_samples,
)


def volunteer_for_profile(*, key: str, viewer) -> User | None:
    """The volunteer whose profile ``key`` names, if ``viewer`` may see it. Others find an
    anonymous volunteer only by pseudonym and a public one by username; a hidden volunteer's
    profile exists only for themselves."""
    owner = viewer if viewer is not None and viewer.is_authenticated else None
    if owner is not None and key in (owner.username, owner.pseudonym):
        return owner
    user = User.objects.filter(pseudonym=key, visibility=User.Visibility.ANONYMOUS).first()
    return user or User.objects.filter(username=key, visibility=User.Visibility.PUBLIC).first()


def volunteer_runs(*, user: User, viewer) -> list[dict]:
    """The runs the volunteer contributed to that the viewer may see, with their confirmed totals
    (and, for the volunteer alone, the credit still pending)."""
    now = timezone.now()
    rows = []
    for total in RunCredit.objects.filter(user=user).select_related("run").order_by("-credit"):
        if not run_may_view(run=total.run, user=viewer):
            continue
        rows.append({
            "run": total.run, "samples": total.samples_verified, "credit": total.credit,
            "credit_provisional": total.credit_provisional if viewer == user else None,
            "recent_average_credit": rac_now(average=total.recent_average_credit, updated_at=total.rac_updated_at, now=now),
            "compute_seconds": total.compute_seconds, "machines": total.machines, "last_seen": total.last_seen_at,
        })
    return rows


def volunteer_machines(*, user: User) -> list[dict]:
    """Each of the volunteer's machines (one per agent token) in each run it trained for (only the owner
    sees this): the samples it reported and what became of them (confirmed, still pending, lost: the
    epochs that earned nothing, which :func:`volunteer_lost_epochs` explains), and how its latest session
    stands: training, suspended by the spot checks, or stopped (since its last report). A restarted agent
    keeps its token, so a machine that came back is one machine, not two. ``days``: its samples on each of
    the last ``MACHINE_DAYS`` days (UTC), for a small chart."""
    per_token = (
        ContributionEvent.objects.filter(session__user=user)
        .values("session__token_id", "session__token__name", "session__run_id")
        .annotate(samples=Sum("samples"), last_seen=Max("received_at"))
        .order_by("session__token__name", "session__run_id")
    )
    judged = {
        (row["session__token_id"], row["session__run_id"]): row
        for row in SessionEpoch.objects.filter(session__user=user)
        .values("session__token_id", "session__run_id")
        .annotate(confirmed=Sum(_CONFIRMED), lost=Sum(F("reported_samples") - _CONFIRMED,
                                                       filter=Q(status__in=_JUDGED)))
    }
    latest: dict[tuple, TrainingSession] = {}
    for session in TrainingSession.objects.filter(user=user).order_by("started_at", "pk"):
        latest[(session.token_id, session.run_id)] = session
    runs = {run.pk: run for run in Run.objects.filter(pk__in={row["session__run_id"] for row in per_token})}
    now = timezone.now()
    days = [(now - datetime.timedelta(days=back)).date() for back in range(MACHINE_DAYS - 1, -1, -1)]
    daily: dict[tuple, dict] = {}
    for row in (ContributionEvent.objects.filter(session__user=user, received_at__date__gte=days[0])
                .annotate(day=TruncDate("received_at")).values("session__token_id", "session__run_id", "day")
                .annotate(samples=Sum("samples"))):
        daily.setdefault((row["session__token_id"], row["session__run_id"]), {})[row["day"]] = row["samples"]
    live_since = now - LIVE_SESSION_SEEN_WITHIN
    machines = []
    for row in per_token:
        key = (row["session__token_id"], row["session__run_id"])
        run, session, epochs = runs[key[1]], latest.get(key), judged.get(key, {})
        confirmed, lost = epochs.get("confirmed") or 0, epochs.get("lost") or 0
        pending = max(0, row["samples"] - confirmed - lost)  # not judged yet, or flagged for an organizer
        per_sample = run_credit_per_sample(run)
        if session is not None and session.suspended_at is not None:
            state = "suspended"
        elif session is not None and session.ended_at is None and session.last_seen_at >= live_since:
            state = "training"
        else:
            state = "stopped"
        machines.append({
            "token_id": key[0], "name": row["session__token__name"] or _("a deleted token"), "run": run, "state": state,
            "suspension_reason": session.suspension_reason if state == "suspended" else "",
            "samples": row["samples"], "confirmed": confirmed, "lost": lost,
            "pending": pending, "credit": confirmed * per_sample, "credit_pending": pending * per_sample,
            "last_seen": row["last_seen"],
            "days": _bars([(day, daily.get(key, {}).get(day, 0)) for day in days]),
        })
    return machines


def machine_credit(*, session: TrainingSession) -> dict:
    """What the session's machine (its agent token) earned in its run, as :func:`volunteer_machines` counts
    it: for the agent's own display (``GET /api/v1/sessions/{id}/credit``). All zero before a report."""
    for machine in volunteer_machines(user=session.user):
        if machine["token_id"] == session.token_id and machine["run"].pk == session.run_id:
            return {"samples": machine["samples"], "confirmed_samples": machine["confirmed"],
                    "pending_samples": machine["pending"], "lost_samples": machine["lost"],
                    "credit": machine["credit"], "credit_pending": machine["credit_pending"]}
    return {"samples": 0, "confirmed_samples": 0, "pending_samples": 0, "lost_samples": 0, "credit": 0.0,
            "credit_pending": 0.0}


MACHINE_DAYS = 14  # the days of each machine's contribution the owner's page draws


def _bars(days: list[tuple[datetime.date, int]]) -> list[dict]:
    """A machine's samples per day as the bars of a small chart: each bar's height in percent of the
    highest day's (a day without samples draws nothing)."""
    top = max((samples for _, samples in days), default=0) or 1
    bars = []
    for index, (day, samples) in enumerate(days):
        height = round(100 * samples / top)
        bars.append({"day": day, "samples": samples, "x": index * 5, "y": 100 - height, "height": height})
    return bars


# The samples of an epoch that earn credit (runs.models.epoch_confirmed_samples, in SQL): a verified epoch
# the smaller of the reported and the announced samples, an accepted one what was reported.
_CONFIRMED = Case(
    When(status=SessionEpoch.Status.VERIFIED,
         then=Least("reported_samples", Coalesce("announced_samples", "reported_samples"))),
    When(status=SessionEpoch.Status.ACCEPTED, then=F("reported_samples")),
    default=Value(0), output_field=BigIntegerField())
_JUDGED = [SessionEpoch.Status.VERIFIED, SessionEpoch.Status.ACCEPTED, SessionEpoch.Status.REJECTED]

# Why an epoch earned nothing (or less than was reported), in a volunteer's words: the verdicts of
# runs/credit/verification.py and the commitment outcomes of runs/swarm/spotcheck.py, as docs/trust.md
# explains them.
LOST_REASONS = {
    "flagged": _("Waiting for an organizer: the samples your agent reported for this epoch do not match its "
                 "signed records or its spot check. It earns nothing unless an organizer accepts it."),
    "suspended": _("Your session was suspended after a spot check of its steps failed; an organizer decides "
                   "whether it earns."),
    "organizer": _("An organizer rejected this epoch."),
    "diverged": _("Your machine computed this epoch at parameters other than the swarm's (most often an "
                  "averaging round that failed, or a slow connection), so its steps could not be checked. "
                  "It earns nothing; nothing is held against you."),
    "late": _("Your agent committed to this epoch's steps after the deadline, too late to check them."),
    "unchecked": _("The coordinator held no copy of the swarm's state for this epoch, so its steps could not "
                   "be checked. It earns nothing; nothing is held against you."),
    "beyond_reach": _("Your agent's commitment reached further than the work its session had reported, so it "
                      "was not checked."),
    "no_commitment": _("Your agent did not commit to this epoch's steps (it stopped or lost its connection "
                       "before the epoch closed), so they could not be checked."),
    "never_seen": _("The swarm never saw your machine's signed record of this epoch (it left before "
                    "publishing it), so the samples could not be confirmed."),
    "fewer_announced": _("Part of it counts: your machine's signed record announced fewer samples than its "
                         "agent reported, and the smaller figure is the one credited."),
}


def lost_reason(*, row: SessionEpoch, commitment: StepCommitment | None) -> str:
    """Which of :data:`LOST_REASONS` explains ``row``, an epoch that earned less than it reported."""
    if row.status == SessionEpoch.Status.FLAGGED:
        return "suspended" if row.detail.endswith("session suspended by spot checks") else "flagged"
    if row.status == SessionEpoch.Status.VERIFIED:
        return "fewer_announced"
    if row.decided_by_id is not None:
        return "organizer"
    if commitment is not None and commitment.outcome == StepCommitment.Outcome.DIVERGED:
        return "diverged"
    if commitment is not None and commitment.outcome == StepCommitment.Outcome.UNCHECKED:
        if commitment.check_detail.startswith(NO_STATE_HELD.split("{")[0]):
            return "unchecked"
        return "late" if "after the deadline" in commitment.check_detail else "beyond_reach"
    if row.detail in (NEVER_SEEN, NEVER_CONFIRMED):
        return "never_seen"
    return "no_commitment"


def volunteer_lost_epochs(*, user: User, limit: int = 50) -> list[dict]:
    """The volunteer's latest ``limit`` epochs that earned less than their agents reported, newest first,
    each with its machine, the samples it lost and why (only the owner sees this)."""
    rows = list(
        SessionEpoch.objects.filter(session__user=user)
        .filter(Q(status__in=[SessionEpoch.Status.FLAGGED, SessionEpoch.Status.REJECTED])
                | Q(status=SessionEpoch.Status.VERIFIED, announced_samples__lt=F("reported_samples")))
        .exclude(reported_samples=0)
        .select_related("session__run", "session__token")
        .order_by("-session__started_at", "-epoch")[:limit]
    )
    commitments = {
        (commitment.session_id, commitment.epoch): commitment
        for commitment in StepCommitment.objects.filter(
            session__in={row.session_id for row in rows}, epoch__in={row.epoch for row in rows})
    }
    lost = []
    for row in rows:
        earned = epoch_confirmed_samples(status=row.status, reported=row.reported_samples,
                                         announced=row.announced_samples)
        reason = lost_reason(row=row, commitment=commitments.get((row.session_id, row.epoch)))
        lost.append({"run": row.session.run, "machine": row.session.token.name if row.session.token else _("a deleted token"),
                     "epoch": row.epoch, "reported": row.reported_samples, "lost": row.reported_samples - earned,
                     "pending": row.status == SessionEpoch.Status.FLAGGED, "reason": reason,
                     "explanation": LOST_REASONS[reason], "at": row.checked_at})
    return lost


def volunteer_daily(*, user: User) -> list[dict]:
    """Samples and credit per UTC day, across all runs, oldest first."""
    days = (
        CreditHour.objects.filter(user=user)
        .annotate(day=TruncDate("hour"))
        .values("day")
        .annotate(samples=Sum("samples"), credit=Sum("credit"))
        .order_by("day")
    )
    return [{"day": row["day"].isoformat(), "samples": row["samples"], "credit": row["credit"]} for row in days]


def milestones_shown(*, viewer, **holder) -> list[Milestone]:
    """The badges a volunteer (``user=``) or a team (``team=``) holds now that ``viewer`` may see,
    the highest of each measure in each scope: across all runs first, then in each run the viewer
    may see (a members-only run's badge would name the run)."""
    badges = Milestone.objects.filter(**holder, revoked_at=None).select_related("run").order_by("-threshold")
    highest: dict[tuple, Milestone] = {}
    for badge in badges:
        highest.setdefault((badge.run_id or 0, badge.measure), badge)
    shown = [badge for badge in highest.values() if badge.run is None or run_may_view(run=badge.run, user=viewer)]
    return sorted(shown, key=lambda badge: (badge.run_id or 0, badge.measure))
