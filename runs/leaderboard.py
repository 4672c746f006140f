"""Leaderboards and the live snapshot of a run, computed from the contribution events."""

import datetime

from django.db.models import Count, Max, Sum
from django.utils import timezone

from accounts.models import Team, User
from runs.models import ContributionEvent, Run

WINDOWS = {"24h": datetime.timedelta(hours=24), "7d": datetime.timedelta(days=7), "all": None}
ALIVE_AFTER = datetime.timedelta(seconds=60)


def _events(*, run: Run, window: str):
    events = ContributionEvent.objects.filter(session__run=run)
    if WINDOWS[window] is not None:
        events = events.filter(received_at__gte=timezone.now() - WINDOWS[window])
    return events


def leaderboard_rows(*, run: Run, by: str = "user", window: str = "all") -> list[dict]:
    """Ranked rows: name, samples, share, last seen, machines. Hidden volunteers count toward
    the run's total (and their team's) but never appear by name."""
    key = "session__user" if by == "user" else "session__user__team"
    grouped = (
        _events(run=run, window=window)
        .values(key)
        .annotate(samples=Sum("samples"), last_seen=Max("received_at"), machines=Count("session__token", distinct=True))
        .order_by("-samples")
    )
    grouped = list(grouped)
    total = sum(row["samples"] for row in grouped) or 1
    names = _names(by=by, ids=[row[key] for row in grouped])
    rows = []
    for row in grouped:
        name = names.get(row[key])
        if name is None:
            continue
        rows.append({
            "rank": len(rows) + 1,
            "name": name,
            "samples": row["samples"],
            "share": row["samples"] / total,
            "last_seen": row["last_seen"],
            "machines": row["machines"],
        })
    return rows


def _names(*, by: str, ids: list) -> dict:
    if by == "team":
        return {team.pk: team.name for team in Team.objects.filter(pk__in=[i for i in ids if i])}
    return {user.pk: user.public_name for user in User.objects.filter(pk__in=ids) if user.public_name}


def run_snapshot(*, run: Run) -> dict:
    """What the live page shows: the board and the collaboration's pace right now."""
    now = timezone.now()
    recent = ContributionEvent.objects.filter(session__run=run, received_at__gte=now - ALIVE_AFTER)
    latest = recent.values("session").annotate(rate=Max("samples_per_second"), epoch=Max("local_epoch"))
    last_loss = recent.exclude(loss=None).order_by("-received_at").values_list("loss", flat=True).first()
    return {
        "type": "snapshot",
        "leaderboard": [{**row, "last_seen": row["last_seen"].isoformat()} for row in leaderboard_rows(run=run)[:50]],
        "samples_per_second": round(sum(row["rate"] for row in latest), 2),
        "alive_peers": len(latest),
        "epoch": max((row["epoch"] for row in latest), default=None),
        "loss": last_loss,
    }
