"""Leaderboards and the live snapshot of a run, read from the rollup's aggregates (runs/credit/rollup.py):
never an aggregation over the contribution events, so a board costs the same with 10 or 10M.

Pages, the API and the live frames read a board through :func:`board_rows`: the rows cached under the boards'
version (``CreditRollup.boards_version``), which moves with every pass that holds the rollup's lock and with
every change to a public name, a visibility, a team or what the run list shows of a run (the receivers below;
the API's snapshots of boards and of the run list, portal/snapshots.py, are kept under it too). A cached board is the rows an
uncached read (:func:`leaderboard_rows`) gave at its version; recent average credit decays from the time it was
read, at most one rollup pass (~10 s) ago.
"""

import contextlib
import datetime
import logging

from django.core.cache import cache
from django.db.models import Count, Max, Sum
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver
from django.urls import reverse
from django.utils import timezone

from accounts.models import Team, User
from runs.credit import columns
from runs.credit.milestones import milestones_held
from runs.credit.rollup import rac_now
from runs.credit.schemas import BoardSnapshot, LiveSnapshot
from runs.models import (
    ContributionEvent,
    CreditRollup,
    Run,
    RunCredit,
    RunCreditTotal,
    RunSample,
    RunTeamCredit,
    TeamCredit,
    VolunteerCredit,
)

logger = logging.getLogger(__name__)

# window -> (samples column, credit column) of the aggregates: confirmed samples and credit only
# (docs/trust.md); pending credit never moves a rank. TEAM_COUNTS: window -> (members, machines column).
WINDOWS, TEAM_COUNTS = columns.WINDOWS, columns.TEAM_COUNTED
BY = ("user", "team")
ALIVE_AFTER = datetime.timedelta(seconds=60)
PAGE_MAX = 500
# A backstop only: the boards' version moves at every rollup pass (CREDIT_ROLLUP_EVERY_SECONDS).
BOARD_CACHE_SECONDS = 60
# What a board shows of a volunteer and of a team (their rows' names and profile links, and who is hidden).
USER_SHOWN = {"username", "display_name", "visibility", "pseudonym", "team"}
TEAM_SHOWN = {"name", "slug", "disbanded_at"}
# What the run list and a run's summary show (runs/api/routes.py, RunSummary), and who may see a run's board.
RUN_SHOWN = {"slug", "name", "description", "status", "visibility", "audience", "config", "tokenizer_status"}


def volunteer_profile_key(user: User) -> str | None:
    """The name a volunteer's profile is found by: the pseudonym of an anonymous volunteer (never
    the username, which would unmask them), none for a hidden one."""
    if user.visibility == User.Visibility.HIDDEN:
        return None
    return user.pseudonym if user.visibility == User.Visibility.ANONYMOUS else user.username


def _totals(run: Run | None):
    return RunCredit.objects.filter(run=run) if run is not None else VolunteerCredit.objects.all()


def leaderboard_rows(*, run: Run | None, by: str = "user", window: str = "all", limit: int = 100, offset: int = 0) -> list[dict]:
    """Ranked rows of one run's board, or of all runs' when ``run`` is None: name, confirmed samples
    and credit (pending credit is its owner's and the organizers' business, never a board's), share
    of the board's credit, RAC, compute time, last seen, machines. Hidden volunteers count toward the
    total and their team's row but never appear.

    A team's row is the credit its members earned while in it (RunTeamCredit: a volunteer who
    changes teams leaves their past work with the old team); members and machines are those of
    its current members who contributed in the window."""
    samples_column, credit_column = WINDOWS[window]
    board = board_credit(run=run, window=window)
    if by == "team":
        rows = _team_rows(run, window, limit=limit, offset=offset)
    else:
        totals = _totals(run).filter(**{f"{samples_column}__gt": 0})
        rows = _user_rows(totals, samples_column, credit_column, limit=limit, offset=offset)
    badges = milestones_held(run_id=run.pk if run is not None else None, holder=by,
                             ids=[row["holder_id"] for row in rows])
    for rank, row in enumerate(rows, start=offset + 1):
        row["rank"] = rank
        row["share"] = row["credit"] / board if board else 0.0
        row["milestones"] = badges.get(row.pop("holder_id"), [])
    return rows


def board_rows(*, run: Run | None, by: str = "user", window: str = "all", limit: int = 100, offset: int = 0) -> list[dict]:
    """:func:`leaderboard_rows`, cached under the boards' version: read first, so that rows cached under a
    version are never older than it."""
    def read() -> list[dict]:
        return leaderboard_rows(run=run, by=by, window=window, limit=limit, offset=offset)

    version = CreditRollup.objects.filter(pk=1).values_list("boards_version", flat=True).first()
    if not version:  # nothing was ever rolled up
        return read()
    key = f"board:{run.pk if run is not None else '-'}:{by}:{window}:{limit}:{offset}:{version}"
    try:
        rows = cache.get(key)
    except Exception:  # the cache only saves work: while it is away (Redis restarting), boards are read afresh
        logger.warning("boards' cache unavailable; reading the board afresh", exc_info=True)
        return read()
    if rows is None:
        rows = read()
        with contextlib.suppress(Exception):  # as above: a board not kept is read again next time
            cache.set(key, rows, BOARD_CACHE_SECONDS)
    return rows


@receiver(post_save, sender=User)
@receiver(post_save, sender=Team)
@receiver(post_save, sender=Run)
def _shown_saved(sender, instance, created: bool = False, update_fields=None, **kwargs) -> None:
    shown = {User: USER_SHOWN, Team: TEAM_SHOWN, Run: RUN_SHOWN}[sender]
    # A new volunteer or team has no credit yet; a new run may be in the run list at once.
    if (not created or sender is Run) and (update_fields is None or shown & set(update_fields)):
        CreditRollup.boards_changed()


@receiver(post_delete, sender=User)
@receiver(post_delete, sender=Team)
@receiver(post_delete, sender=Run)
@receiver(m2m_changed, sender=Run.organizers.through)
def _shown_deleted(sender, instance, **kwargs) -> None:
    CreditRollup.boards_changed()


def board_credit(*, run: Run | None, window: str = "all") -> float:
    """The credit of the whole board in the window (what the share column divides by): the run's
    total, or the sum of the runs' totals across runs, which the rollup keeps (RunCreditTotal)."""
    credit_column = WINDOWS[window][1]
    if run is not None:
        return RunCreditTotal.objects.filter(run=run).values_list(credit_column, flat=True).first() or 0.0
    return RunCreditTotal.objects.aggregate(credit=Sum(credit_column))["credit"] or 0.0


def _credit_fields(total, samples_column: str, credit_column: str, now) -> dict:
    """The columns a volunteer's row and a team's row share, read from their totals."""
    return {
        "samples": getattr(total, samples_column),
        "credit": getattr(total, credit_column),
        "credit_verified": total.credit_verified,
        "recent_average_credit": rac_now(average=total.recent_average_credit, updated_at=total.rac_updated_at, now=now),
        "compute_seconds": total.compute_seconds,
        "last_seen": total.last_seen_at,
    }


def _user_rows(totals, samples_column: str, credit_column: str, *, limit: int, offset: int) -> list[dict]:
    visible = (
        totals.exclude(user__visibility=User.Visibility.HIDDEN)
        .select_related("user")
        .only(samples_column, credit_column, "credit_verified", "recent_average_credit", "user_id",
              "rac_updated_at", "compute_seconds", "machines", "last_seen_at",
              "user__username", "user__display_name", "user__visibility", "user__pseudonym")
        .order_by(f"-{credit_column}", "user_id")[offset:offset + limit]
    )
    now = timezone.now()
    return [
        {
            "holder_id": total.user_id,
            "name": total.user.public_name,
            "profile_url": reverse("volunteer-detail", args=[volunteer_profile_key(total.user)]),
            **_credit_fields(total, samples_column, credit_column, now),
            "machines": total.machines,
        }
        for total in visible
    ]


def _team_rows(run: Run | None, window: str, *, limit: int, offset: int) -> list[dict]:
    samples_column, credit_column = WINDOWS[window]
    members_column, machines_column = TEAM_COUNTS[window]
    team_totals = RunTeamCredit.objects.filter(run=run) if run is not None else TeamCredit.objects.all()
    ranked = (
        team_totals.filter(**{f"{samples_column}__gt": 0}, team__disbanded_at=None)
        .select_related("team")
        .only(samples_column, credit_column, "credit_verified", "recent_average_credit",
              "rac_updated_at", "compute_seconds", "last_seen_at", members_column, machines_column, "team__name", "team__slug")
        .order_by(f"-{credit_column}", "team_id")[offset:offset + limit]
    )
    now = timezone.now()
    return [
        {
            "holder_id": total.team_id,
            "name": total.team.name,
            "profile_url": reverse("team-detail", args=[total.team.slug]),
            **_credit_fields(total, samples_column, credit_column, now),
            "machines": getattr(total, machines_column),
            "members": getattr(total, members_column),
        }
        for total in ranked
    ]


def _pace(run: Run, now: datetime.datetime) -> dict:
    """The collaboration's pace: the monitor's newest reading of the swarm when it is fresh, else
    what the agents reported in the last minute."""
    sample = RunSample.objects.filter(run=run, at__gte=now - ALIVE_AFTER).order_by("-at").first()
    if sample is not None:
        return {"samples_per_second": round(sample.samples_per_second, 2), "alive_peers": sample.alive_peers,
                "epoch": sample.global_epoch, "loss": sample.loss, "pace_source": "monitor"}
    recent = ContributionEvent.objects.filter(session__run=run, received_at__gte=now - ALIVE_AFTER)
    latest = recent.values("session").annotate(rate=Max("samples_per_second"), epoch=Max("local_epoch"))
    last_loss = recent.exclude(loss=None).order_by("-received_at").values_list("loss", flat=True).first()
    return {
        "samples_per_second": round(sum(row["rate"] for row in latest), 2),
        "alive_peers": len(latest),
        "epoch": max((row["epoch"] for row in latest), default=None),
        "loss": last_loss,
        "pace_source": "reports",
    }


def run_snapshot(*, run: Run) -> dict:
    """What the live page shows: the board and the collaboration's pace right now, as the JSON form
    of ``runs.credit.schemas.LiveSnapshot`` (the frame ``WS /ws/runs/{slug}/live/`` sends)."""
    rows = board_rows(run=run, limit=50)
    totals = RunCredit.objects.filter(run=run, samples_verified__gt=0).aggregate(
        samples_total=Sum("samples_verified"), credit_total=Sum("credit"), volunteers=Count("user_id"),
    )
    snapshot = LiveSnapshot(
        leaderboard=rows,
        totals={key.removesuffix("_total"): value or 0 for key, value in totals.items()},
        **_pace(run, timezone.now()),
    )
    return snapshot.model_dump(mode="json")


def board_snapshot(*, by: str, window: str, limit: int = 100) -> dict:
    """What the board across all runs shows, as the JSON form of ``runs.credit.schemas.BoardSnapshot``
    (the frame ``WS /ws/leaderboard/live/`` sends)."""
    rows = board_rows(run=None, by=by, window=window, limit=limit)
    return BoardSnapshot(by=by, window=window, leaderboard=rows).model_dump(mode="json")
