"""Credit you can rebuild: the aggregates the rollup (runs/credit/rollup.py) keeps by adding
differences, compared with a recount from the record (runs/credit/recount.py), and rewritten from it.

Both hold the rollup's lock (rollup.watermark_lock) for one transaction: no rollup pass, no
``pending_expire`` and no RAC decay runs meanwhile; reports keep arriving (the recount stops at the
watermark) and boards keep reading the old figures until the transaction commits. On PostgreSQL the
rebuild also locks the aggregate rows it writes, and the SessionEpoch rows whose credited samples it
corrects, until then; the check's catch-up pass locks what a rollup pass locks, until it rolls
back. On SQLite every transaction takes the database's write lock, so other writers, ingest
included, wait for either (up to the 20 s ``timeout`` of portal/settings.py).
"""

import datetime
import math
from collections import Counter
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from accounts.models import Team, User
from runs.credit.columns import BUCKETED, WINDOWS
from runs.credit.milestones import milestones_refresh_all
from runs.credit.recount import TABLES, TEAM_COUNT_FIELDS, Figures, credit_recount
from runs.credit.rollup import credit_rollup, rac_now, watermark_lock
from runs.models import Run, SessionEpoch

RELATIVE_TOLERANCE = 1e-9  # float sums added in another order differ in their last bits
# Figures that say nothing of credit: a row holding only these is the same as no row.
NOT_CREDIT = {"machines", "rac_updated_at", *TEAM_COUNT_FIELDS}
WINDOWED_TABLES = ("RunCredit", "VolunteerCredit", "RunCreditTotal", "RunTeamCredit", "TeamCredit")


@dataclass(frozen=True)
class Drift:
    """One figure of one row that the stored aggregates and the recount disagree on (None for a
    row that one side lacks), or, with a ``rule``, that breaks it in the recount."""

    table: str
    key: tuple
    field: str
    stored: object
    recounted: object
    rule: str = ""


def credit_rebuild(*, run: Run | None = None, now: datetime.datetime | None = None) -> list[Drift]:
    """Recount every credit aggregate from the record, of one run or of all, and write what differs,
    in one transaction. The dated figures (buckets, windows, RAC, team shares) are recounted as the
    rollup reaches them when it keeps up (runs/credit/recount.py). Returns what it changed."""
    now = now or timezone.now()
    with transaction.atomic():
        watermark_lock()
        recounted, stored = credit_recount(run_id=run.pk if run else None, now=now, history=True)
        drifts = credit_drift(recounted, stored, now=now)
        _write(recounted, stored, drifts)
        if drifts:
            milestones_refresh_all()  # badges follow the rewritten totals
    return drifts


def credit_check(*, run: Run | None = None, history: bool = False) -> list[Drift]:
    """Where the stored aggregates drifted from the record, without writing anything: in a
    transaction it rolls back, the rollup catches up first (what its next pass would do), then the
    aggregates are compared with a recount. Without ``history`` the stored dated figures are taken
    as the record of when the rollup applied each change, and only what follows from them is
    checked (the windows, the all-runs and run totals); with it they are compared with their
    recount too, which also lists what lagging passes, twice-judged epochs and RAC decays made
    legitimately different."""
    with transaction.atomic():
        credit_rollup()
        watermark_lock()
        now = timezone.now()
        recounted, stored = credit_recount(run_id=run.pk if run else None, now=now, history=history)
        drifts = credit_drift(recounted, stored, now=now) + windows_beyond_totals(recounted)
        transaction.set_rollback(True)
    return drifts


def credit_drift(recounted: Figures, stored: Figures, *, now: datetime.datetime) -> list[Drift]:
    """Every figure the two sides disagree on: integers and moments exactly, sums of floats to
    RELATIVE_TOLERANCE (of the row's largest figure), RAC decayed to ``now``."""
    drifts = []
    for name, (_, _, fields) in TABLES.items():
        for key in sorted(recounted[name].keys() | stored[name].keys()):
            new, old = recounted[name].get(key), stored[name].get(key)
            if new is None or old is None:
                if not _empty(new or old, fields):
                    drifts += [Drift(name, key, field, _get(old, field), _get(new, field)) for field in fields
                               if field not in NOT_CREDIT and _get(new or old, field)]
                continue
            scale = max([abs(row[field]) for row in (new, old) for field in fields if isinstance(row[field], float)],
                        default=0.0)
            for field in fields:
                if field == "rac_updated_at":
                    continue
                stored_value, recounted_value = _value(old, field, now), _value(new, field, now)
                if not _same(stored_value, recounted_value, scale):
                    drifts.append(Drift(name, key, field, stored_value, recounted_value))
    return drifts


def windows_beyond_totals(figures: Figures) -> list[Drift]:
    """Totals whose 24 h or 7 d window holds more confirmed samples than they have at all: credit
    taken back that the hourly buckets kept."""
    confirmed = WINDOWS["all"][0]
    drifts = []
    for name in WINDOWED_TABLES:
        for key, row in figures[name].items():
            drifts += [Drift(name, key, samples, row[samples], row[confirmed], rule=f"at most {confirmed}")
                       for samples in (WINDOWS[column.window][0] for column in BUCKETED if column.measure == "samples")
                       if row[samples] > row[confirmed]]
    return drifts


def _get(row: dict | None, field: str):
    return None if row is None else row.get(field)


def _empty(row: dict, fields) -> bool:
    return not any(row.get(field) for field in fields if field not in NOT_CREDIT)


def _value(row: dict, field: str, now: datetime.datetime):
    if field == "recent_average_credit":
        return rac_now(average=row[field], updated_at=row["rac_updated_at"], now=now)
    return row[field]


def _same(stored, recounted, scale: float) -> bool:
    if isinstance(stored, float) or isinstance(recounted, float):
        return math.isclose(stored or 0.0, recounted or 0.0, rel_tol=RELATIVE_TOLERANCE, abs_tol=RELATIVE_TOLERANCE * scale)
    return stored == recounted


def _write(recounted: Figures, stored: Figures, drifts: list[Drift]) -> None:
    """Write the rows with a drifted figure as recounted; delete those the recount has none of."""
    changed = {(drift.table, drift.key) for drift in drifts}
    for name, (model, key, fields) in TABLES.items():
        keys = [row_key for table, row_key in changed if table == name]
        if name == "SessionEpoch":
            rows = [SessionEpoch(pk=pk, credited_samples=recounted[name][(pk,)]["credited_samples"]) for (pk,) in keys]
            SessionEpoch.objects.bulk_update(rows, ["credited_samples"], batch_size=2000)
            continue
        gone = [stored[name][row_key]["id"] for row_key in keys if row_key not in recounted[name]]
        model.objects.filter(pk__in=gone).delete()
        rows = [model(**dict(zip(key, row_key, strict=True)), **{field: recounted[name][row_key][field] for field in fields})
                for row_key in keys if row_key in recounted[name]]
        model.objects.bulk_create(rows, update_conflicts=True, unique_fields=[column.removesuffix("_id") for column in key],
                                  update_fields=list(fields), batch_size=2000)


def drift_report(drifts: list[Drift], *, limit: int | None = None) -> list[str]:
    """A line naming each drifted figure, ``limit`` of them at most."""
    names = _names(drifts[:limit])
    lines = [f"{drift.table} {_label(drift.table, drift.key, names)}: {drift.field} "
             + (f"{_shown(drift.stored)}, {drift.rule} ({_shown(drift.recounted)})" if drift.rule else
                f"stored {_shown(drift.stored)}, recounted {_shown(drift.recounted)}") for drift in drifts[:limit]]
    if limit is not None and len(drifts) > limit:
        lines.append(f"… and {len(drifts) - limit} more")
    return lines


def drift_summary(drifts: list[Drift]) -> list[str]:
    """A line per table: the rows that drifted, and how many of each figure."""
    lines = []
    for table in TABLES:
        fields = Counter(drift.field for drift in drifts if drift.table == table)
        if fields:
            rows = len({drift.key for drift in drifts if drift.table == table})
            lines.append(f"{table}: {rows} rows ({', '.join(f'{field} {count}' for field, count in fields.most_common())})")
    return lines


def _names(drifts: list[Drift]) -> dict[str, dict]:
    ids = {column: set() for column in ("run_id", "user_id", "team_id", "id")}
    for drift in drifts:
        for column, value in zip(TABLES[drift.table][1], drift.key, strict=True):
            if column in ids:
                ids[column].add(value)
    return {
        "run_id": dict(Run.objects.filter(pk__in=ids["run_id"]).values_list("pk", "slug")),
        "user_id": dict(User.objects.filter(pk__in=ids["user_id"]).values_list("pk", "username")),
        "team_id": dict(Team.objects.filter(pk__in=ids["team_id"]).values_list("pk", "slug")),
        "id": {pk: f"session {session} epoch {epoch}" for pk, session, epoch in
               SessionEpoch.objects.filter(pk__in=ids["id"]).values_list("pk", "session_id", "epoch")},
    }


def _label(table: str, key: tuple, names: dict[str, dict]) -> str:
    parts = []
    for column, value in zip(TABLES[table][1], key, strict=True):
        if column == "hour":
            parts.append(f"hour {value:%Y-%m-%d %H:00}")
        else:
            shown = names[column].get(value, value)
            parts.append(shown if column == "id" else f"{column.removesuffix('_id')} {shown}")
    return ", ".join(parts)


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "—" if value is None else str(value)
