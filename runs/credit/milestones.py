"""Milestone badges: the thresholds (the one place they are set; docs/volunteers.md lists them) and
how the rollup keeps each volunteer's and team's badges in step with their confirmed totals.

A badge follows the confirmed figures the boards rank by (``samples_verified``, ``credit``), never
reported or pending ones: flagged work earns none, and work an organizer rejects later takes back
the badges it had earned (revoked, not deleted, so a badge given back keeps its first date and is
announced once)."""

import datetime
from collections.abc import Iterable

from django.urls import reverse
from django.utils import timezone

from accounts.models import Team, User
from accounts.notifications import milestone_words, notify, notify_many
from runs.models import CreditRollup, Milestone, Run, RunCredit, RunTeamCredit, TeamCredit, VolunteerCredit

# measure -> the totals' column it reads: confirmed samples, and confirmed credit in GFLOP.
MEASURES = {Milestone.Measure.SAMPLES: "samples_verified", Milestone.Measure.CREDIT: "credit"}
# The same thresholds hold in each run and across all runs; a team's are ten times a volunteer's.
VOLUNTEER_THRESHOLDS = {
    Milestone.Measure.SAMPLES: (1_000, 10_000, 100_000, 1_000_000, 10_000_000),
    Milestone.Measure.CREDIT: (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000),
}
TEAM_THRESHOLDS = {measure: tuple(10 * threshold for threshold in thresholds)
                   for measure, thresholds in VOLUNTEER_THRESHOLDS.items()}
# holder -> (its thresholds, its per-run totals, its all-runs totals)
HOLDERS = {"user": (VOLUNTEER_THRESHOLDS, RunCredit, VolunteerCredit), "team": (TEAM_THRESHOLDS, RunTeamCredit, TeamCredit)}
CHUNK = 2000

Key = tuple[int, int | None, str, int]  # holder id, run id (None: all runs), measure, threshold


def milestones_due(*, thresholds: dict, figures: dict[str, float]) -> set[tuple[str, int]]:
    """The (measure, threshold) pairs that confirmed ``figures`` (column -> value) have reached."""
    return {(measure, threshold) for measure, column in MEASURES.items()
            for threshold in thresholds[measure] if figures.get(column, 0) >= threshold}


def _due(holder: str, ids: list[int]) -> set[Key]:
    thresholds, per_run, all_runs = HOLDERS[holder]
    due: set[Key] = set()
    for model, run_field in ((per_run, "run_id"), (all_runs, None)):
        rows = model.objects.filter(**{f"{holder}_id__in": ids}).values(f"{holder}_id", *(["run_id"] if run_field else []),
                                                                        *MEASURES.values())
        for row in rows:
            due |= {(row[f"{holder}_id"], row.get("run_id"), measure, threshold)
                    for measure, threshold in milestones_due(thresholds=thresholds, figures=row)}
    return due


def milestones_refresh(*, holder: str, ids: Iterable[int], now: datetime.datetime | None = None,
                       announce: bool = True) -> list[Milestone]:
    """Bring these volunteers' (``holder="user"``) or teams' (``"team"``) badges in step with their
    totals: award those newly reached, revoke those no longer held, give back revoked ones reached
    again. Idempotent. Returns the badges reached for the first time, announced unless ``announce``
    is false."""
    now = now or timezone.now()
    ids = sorted(set(ids))
    first: list[Milestone] = []
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        due = _due(holder, chunk)
        # Keys and ids only: building model instances (and their dates) was most of a pass's cost.
        badges = Milestone.objects.filter(**{f"{holder}_id__in": chunk})
        fields = (f"{holder}_id", "run_id", "measure", "threshold", "pk")
        active = {row[:4]: row[4] for row in badges.filter(revoked_at=None).values_list(*fields)}
        revoked = {row[:4]: row[4] for row in badges.exclude(revoked_at=None).values_list(*fields)}
        held = active.keys() | revoked.keys()
        revoke = [pk for key, pk in active.items() if key not in due]
        restore = [pk for key, pk in revoked.items() if key in due]
        new = [Milestone(**{f"{holder}_id": key[0]}, run_id=key[1], measure=key[2], threshold=key[3], reached_at=now)
               for key in sorted(due - held, key=str)]
        Milestone.objects.filter(pk__in=revoke).update(revoked_at=now)
        Milestone.objects.filter(pk__in=restore).update(revoked_at=None)
        # A concurrent pass may insert the same badge first: the unique constraints keep one.
        Milestone.objects.bulk_create(new, ignore_conflicts=True)
        # Restored badges keep their first date: the rows dated ``now`` are the ones this pass inserted.
        first += list(Milestone.objects.filter(**{f"{holder}_id__in": chunk}, reached_at=now)) if new else []
    if announce:
        milestones_announce(first)
    return first


def milestones_refresh_all() -> int:
    """Every volunteer's and team's badges from their totals (after a rebuild, and hourly as a
    safety net). Returns the badges reached for the first time. What it finds is not announced:
    on a portal that had volunteers before badges existed, its first pass would otherwise notify
    every one of them at once; the rollup announces what it awards as work is counted."""
    reached = 0
    for holder, (_, _, all_runs) in HOLDERS.items():
        held = set(Milestone.objects.filter(**{f"{holder}__isnull": False}).values_list(f"{holder}_id", flat=True))
        ids = held | set(all_runs.objects.values_list(f"{holder}_id", flat=True))
        reached += len(milestones_refresh(holder=holder, ids=ids, announce=False))
    CreditRollup.boards_changed()  # badges revoked or restored outside the rollup's lock
    return reached


def milestones_announce(badges: list[Milestone]) -> None:
    """Tell each volunteer about the badges they reached for the first time (a team's: each of its
    current members), through the notifications service, in the transaction that awarded them:
    each badge is announced once (its key), however often the rollup runs or a badge is restored."""

    runs = dict(Run.objects.filter(pk__in={badge.run_id for badge in badges if badge.run_id}).values_list("pk", "name"))
    for badge in badges:
        if badge.user_id is not None:
            recipients, key = User.objects.filter(pk=badge.user_id), f"badge:{badge.pk}"
            url = reverse("volunteer-detail", args=[recipients[0].username]) if recipients else "/"
        else:
            recipients, key = None, f"team-badge:{badge.pk}"
            url = reverse("team-detail", args=[Team.objects.values_list("slug", flat=True).get(pk=badge.team_id)])
        run_name = runs.get(badge.run_id)
        context = {"milestone": milestone_words(measure=badge.measure, threshold=badge.threshold, run_name=run_name),
                   "measure": badge.measure, "threshold": badge.threshold, "run": run_name or "", "url": url}
        if recipients is None:  # a team's: every current member, in one insert
            members = list(User.objects.filter(team_id=badge.team_id).values_list("pk", flat=True))
            notify_many(user_ids=members, kind="milestone", key=key, context=context)
        for user in recipients or []:
            notify(user=user, kind="milestone", key=key, context=context)


def milestones_held(*, run_id: int | None, holder: str, ids: Iterable[int]) -> dict[int, list[dict]]:
    """The highest badge of each measure that each holder holds now, in a run (or across all runs,
    ``run_id=None``): what a board shows next to a name."""
    badges = Milestone.objects.filter(**{f"{holder}_id__in": list(ids)}, run_id=run_id, revoked_at=None)
    best: dict[int, dict[str, int]] = {}
    for owner, measure, threshold in badges.values_list(f"{holder}_id", "measure", "threshold"):
        per = best.setdefault(owner, {})
        per[measure] = max(per.get(measure, 0), threshold)
    return {owner: [{"measure": measure, "threshold": per[measure]} for measure in MEASURES if measure in per]
            for owner, per in best.items()}
