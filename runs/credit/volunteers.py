"""A volunteer's public record: the runs they joined, their credit, and their contribution over time."""

from django.db.models import Max, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from accounts.models import User
from runs.credit.rollup import rac_now, run_credit_per_sample
from runs.models import ContributionEvent, CreditHour, Milestone, Run, RunCredit


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
    from runs.access.rules import run_may_view

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
    """What each of the volunteer's agent tokens contributed, per run (only the owner sees this)."""
    per_token = (
        ContributionEvent.objects.filter(session__user=user)
        .values("session__token_id", "session__token__name", "session__run_id")
        .annotate(samples=Sum("samples"), last_seen=Max("received_at"))
        .order_by("session__token__name", "session__run_id")
    )
    runs = {run.pk: run for run in Run.objects.filter(pk__in={row["session__run_id"] for row in per_token})}
    return [
        {"name": row["session__token__name"] or "a deleted token", "run": runs[row["session__run_id"]],
         "samples": row["samples"], "credit": row["samples"] * run_credit_per_sample(runs[row["session__run_id"]]),
         "last_seen": row["last_seen"]}
        for row in per_token
    ]


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
    from runs.access.rules import run_may_view

    badges = Milestone.objects.filter(**holder, revoked_at=None).select_related("run").order_by("-threshold")
    highest: dict[tuple, Milestone] = {}
    for badge in badges:
        highest.setdefault((badge.run_id or 0, badge.measure), badge)
    shown = [badge for badge in highest.values() if badge.run is None or run_may_view(run=badge.run, user=viewer)]
    return sorted(shown, key=lambda badge: (badge.run_id or 0, badge.measure))
