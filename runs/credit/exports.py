"""Daily statistics dumps, as BOINC projects and Folding@home publish them: every volunteer's,
team's and run's credit as gzip JSON and gzip CSV under MEDIA_ROOT/stats/YYYY-MM-DD/, with the
held-out evaluations of public runs' checkpoints.

Like the boards, they count only confirmed credit and samples. Hidden volunteers never appear by
name: they are left out of the volunteers' and runs' files
and counted only in their team's totals.
"""

import datetime
import gzip
import json
import os
from pathlib import Path

from django.conf import settings
from django.db.models import Count, F, Sum
from django.utils import timezone

from accounts.models import User
from portal.csv_export import csv_text
from runs.credit.boards import volunteer_profile_key
from runs.evaluation.selectors import evaluation_row
from runs.models import Evaluation, Run, RunCredit, TeamCredit, VolunteerCredit

KINDS = ("users", "teams", "runs", "evaluations")
FORMATS = ("json.gz", "csv.gz")
FILE_NAMES = frozenset(f"{kind}.{fmt}" for kind in KINDS for fmt in FORMATS)
CREDIT_FIELDS = ["credit", "credit_verified", "recent_average_credit", "compute_seconds", "machines"]


def stats_root() -> Path:
    return Path(settings.MEDIA_ROOT) / "stats"


def _volunteers() -> list[dict]:
    totals = VolunteerCredit.objects.exclude(user__visibility=User.Visibility.HIDDEN).filter(credit__gt=0).select_related(
        "user__team")
    return [
        {"name": total.user.public_name, "profile": volunteer_profile_key(total.user),
         "team": total.user.team.name if total.user.team else "",
         **{field: getattr(total, field) for field in CREDIT_FIELDS}}
        for total in totals.order_by("-credit", "user_id")
    ]


def _teams() -> list[dict]:
    """Teams' totals as the team boards show them (the credit members earned while in the team),
    with their current members who contributed and those members' machines."""
    counts = {
        row["user__team_id"]: row
        for row in VolunteerCredit.objects.exclude(user__team=None).filter(credit__gt=0).values("user__team_id")
        .annotate(members=Count("user_id"), machines=Sum("machines"))
    }
    totals = TeamCredit.objects.filter(team__disbanded_at=None, credit__gt=0).select_related("team").order_by(
        "-credit", "team_id")
    return [{"name": total.team.name, "slug": total.team.slug, "members": counts.get(total.team_id, {}).get("members", 0),
             **{field: getattr(total, field) for field in CREDIT_FIELDS if field != "machines"},
             "machines": counts.get(total.team_id, {}).get("machines") or 0} for total in totals]


def _run_credits() -> list[dict]:
    """Per-run rows of the runs anyone may see listed (public and started)."""
    totals = (
        RunCredit.objects.filter(run__visibility=Run.Visibility.PUBLIC, run__audience=Run.Audience.EVERYONE, credit__gt=0)
        .exclude(run__status=Run.Status.DRAFT)
        .exclude(user__visibility=User.Visibility.HIDDEN)
        .select_related("run", "user")
        .order_by("run_id", "-credit", "user_id")
    )
    return [
        {"run": total.run.slug, "name": total.user.public_name, "profile": volunteer_profile_key(total.user),
         "samples": total.samples_verified, **{field: getattr(total, field) for field in CREDIT_FIELDS}}
        for total in totals
    ]


def _evaluations() -> list[dict]:
    """Held-out scores of each checkpoint (and the baselines) of the runs listed publicly."""
    evaluations = (
        Evaluation.objects.filter(run__visibility=Run.Visibility.PUBLIC, run__audience=Run.Audience.EVERYONE,
                                  mlm_accuracy__isnull=False)
        .exclude(run__status=Run.Status.DRAFT).select_related("run").order_by("run_id", F("epoch").asc(nulls_first=True), "kind")
    )
    return [{"run": evaluation.run.slug, **evaluation_row(evaluation)} for evaluation in evaluations]


def _write_atomically(path: Path, content: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(content)
    os.replace(partial, path)  # a reader never sees half a file


def stats_dump(*, day: datetime.date | None = None) -> Path:
    """Write the day's dump (rewriting it if it exists: the task is idempotent). Returns its folder."""
    day = day or timezone.now().date()
    folder = stats_root() / day.isoformat()
    folder.mkdir(parents=True, exist_ok=True)
    for kind, rows in (("users", _volunteers()), ("teams", _teams()), ("runs", _run_credits()),
                       ("evaluations", _evaluations())):
        # mtime=0: the same figures give the same bytes.
        _write_atomically(folder / f"{kind}.json.gz", gzip.compress(json.dumps(rows).encode(), mtime=0))
        _write_atomically(folder / f"{kind}.csv.gz", gzip.compress(csv_text(rows).encode(), mtime=0))
    return folder


def stats_dumps() -> list[dict]:
    """The dumps on disk, newest first: day and files (name, size)."""
    root = stats_root()
    days = []
    for folder in sorted(root.iterdir(), reverse=True) if root.is_dir() else []:
        try:
            datetime.date.fromisoformat(folder.name)
        except ValueError:
            continue
        files = [{"name": path.name, "size": path.stat().st_size} for path in sorted(folder.iterdir()) if path.name in FILE_NAMES]
        days.append({"day": folder.name, "files": files})
    return days


def stats_file(*, day: str, name: str) -> Path | None:
    """The dump file named, if it exists; None for any other name (no path tricks get through)."""
    try:
        datetime.date.fromisoformat(day)
    except ValueError:
        return None
    if name not in FILE_NAMES or len(day) != 10:
        return None
    path = stats_root() / day / name
    return path if path.is_file() else None
