"""Credit: what a volunteer's reported samples are worth, and the rollup that turns the append-only
contribution events into the totals the leaderboards read.

Unit: one credit is one GFLOP of training compute: the matrix products of a forward and backward
pass of the run's model, every application of ALBERT's shared layer and the attention over the
whole sequence included (runs/setup/compute.py), so credit is comparable across runs of different model
sizes and sequence lengths.
"""

import datetime
import math
from collections import defaultdict
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Count, Exists, F, FloatField, Max, OuterRef, Q, Sum, When
from django.db.models.functions import Least, TruncHour
from django.utils import timezone

from accounts.models import TeamEvent, User
from peer_agent.protocol import RunConfig
from portal.metrics import ROLLUP_BATCH_SECONDS
from runs.credit.columns import (
    BUCKETED,
    RAC_FIELDS,
    ROW_FIELDS,
    RUN_DERIVED,
    RUN_TOTAL,
    SPLIT_FIELDS,
    SUMMED,
    TEAM_ADDED,
    TEAM_COUNTED,
    WINDOWS,
)
from runs.credit.milestones import milestones_refresh
from runs.models import (
    ContributionEvent,
    CreditHour,
    CreditRollup,
    Run,
    RunCredit,
    RunCreditTotal,
    RunTeamCredit,
    SessionEpoch,
    TeamCredit,
    TeamCreditHour,
    TrainingSession,
    VolunteerCredit,
    epoch_confirmed_samples,
)
from runs.setup.compute import training_flops_per_sample

RAC_HALF_LIFE = datetime.timedelta(days=7)
DAY_SECONDS = 86400.0
# A report claims samples/samples_per_second seconds of training; no report covers more than this.
COMPUTE_SECONDS_PER_REPORT_CAP = 600.0
# Re-read SessionEpoch changes this far back: a monitor write stamped just before our last pass
# may have committed after it. Recomputing a pair twice is harmless.
EPOCH_CHANGES_OVERLAP = datetime.timedelta(minutes=2)
CHUNK = 2000
_has_events = Exists(ContributionEvent.objects.filter(session=OuterRef("pk")))


def credit_per_sample(config: RunConfig) -> float:
    """Credit of one training sample: the GFLOP of its forward and backward pass
    (runs.setup.compute.training_flops_per_sample / 1e9)."""
    return training_flops_per_sample(config) / 1e9


def run_credit_per_sample(run: Run) -> float:
    return credit_per_sample(run.configuration)


def rac_update(*, average: float, updated_at: datetime.datetime | None, work: float,
               now: datetime.datetime) -> tuple[float, datetime.datetime]:
    """BOINC's recent average credit (``update_average`` in boinc/lib/util.cpp), in credit per day.

    With ``diff`` the seconds since the last update and ``weight = exp(-diff·ln2 / half_life)``::

        average = average · weight + (1 − weight) · work / (diff / 86400)      if 1 − weight > 1e-6
        average = average · weight + work · ln2 · 86400 / half_life            otherwise

    The half-life is one week: a volunteer who stops has half the RAC a week later. BOINC's first
    update divides by the work's own duration; we have none, so the first update takes the
    second branch, as if the previous update had just happened.
    """
    if updated_at is None:
        return work * math.log(2) * DAY_SECONDS / RAC_HALF_LIFE.total_seconds(), now
    diff = max((now - updated_at).total_seconds(), 0.0)
    weight = math.exp(-diff * math.log(2) / RAC_HALF_LIFE.total_seconds())
    average *= weight
    if 1.0 - weight > 1e-6:
        average += (1.0 - weight) * work / (diff / DAY_SECONDS)
    else:
        average += work * math.log(2) * DAY_SECONDS / RAC_HALF_LIFE.total_seconds()
    return average, now


def rac_now(*, average: float, updated_at: datetime.datetime | None, now: datetime.datetime | None = None) -> float:
    """The recent average credit decayed to ``now`` (what a board shows between updates)."""
    if updated_at is None:
        return average
    return rac_update(average=average, updated_at=updated_at, work=0.0, now=now or timezone.now())[0]


def rac_grant(*, average: float, updated_at: datetime.datetime | None, work: float,
              now: datetime.datetime) -> tuple[float, datetime.datetime, float]:
    """RAC after ``work`` credit is granted ``now`` (RAC, as BOINC's, grows with granted credit,
    when it is granted), and what it gained over the RAC decayed to ``now``: a team's RAC is the
    sum of what its members gained while in it."""
    decayed = rac_now(average=average, updated_at=updated_at, now=now)
    average, updated_at = rac_update(average=average, updated_at=updated_at, work=work, now=now)
    return average, updated_at, average - decayed


def credit_split(*, samples: int, verified: int, rejected: int, cps: float) -> dict[str, int | float]:
    """The split columns (columns.SPLIT_FIELDS) of a volunteer who reported ``samples`` of which
    the epochs' decisions confirm ``verified`` and reject ``rejected``, never more than reported.
    Credit is the verified part: what every board ranks by."""
    verified = min(verified, samples)
    rejected = min(rejected, samples - verified)
    return {"samples_verified": verified, "samples_rejected": rejected,
            "credit_provisional": (samples - verified - rejected) * cps, "credit_verified": verified * cps,
            "credit": verified * cps}


def hour_start(moment: datetime.datetime) -> datetime.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def window_starts(now: datetime.datetime) -> dict[str, datetime.datetime]:
    """First hourly bucket inside each window: the current hour and the 23 (or 167) before it."""
    return {"24h": hour_start(now) - datetime.timedelta(hours=23), "7d": hour_start(now) - datetime.timedelta(hours=7 * 24 - 1)}


# --- the rollup ---------------------------------------------------------------------------------


def credit_rollup(*, batch_size: int | None = None, max_batches: int = 100) -> int:
    """Bring the aggregates up to date: consume new contribution events in bounded batches, then
    apply SessionEpoch changes and age the 24 h / 7 d windows. Returns the events consumed.
    Safe to run concurrently and repeatedly: each batch locks the watermark row."""
    batch_size = batch_size or settings.CREDIT_ROLLUP_BATCH
    consumed = 0
    for _ in range(max_batches):
        with ROLLUP_BATCH_SECONDS.time():
            count = credit_rollup_batch(batch_size=batch_size)
        consumed += count
        if count < batch_size:
            break
    credit_epochs_refresh()
    credit_windows_age()
    credit_teams_refresh()
    return consumed


def rollup_lag_seconds(*, now: datetime.datetime) -> float:
    """How long the oldest event the rollup has not taken yet has waited; 0 when it has taken them all."""
    mark = CreditRollup.objects.filter(pk=1).values_list("event_id", flat=True).first() or 0
    oldest = ContributionEvent.objects.filter(id__gt=mark).order_by("id").values_list("received_at", flat=True).first()
    return max(0.0, (now - oldest).total_seconds()) if oldest else 0.0


def watermark_lock() -> CreditRollup:
    """The rollup's progress row, locked until the transaction ends: each pass of the rollup takes
    it, and so do pending_expire and the rebuild (runs/credit/rebuild.py), so none runs while another does.
    Every holder may change what the boards show, so the boards' version moves with it (the update takes
    the row's lock)."""
    CreditRollup.boards_changed()
    return CreditRollup.objects.select_for_update().get(pk=1)


def _batch_upper_id(*, after: int, batch_size: int, now: datetime.datetime) -> int | None:
    """The last event id of the next batch. Events newer than the settle delay end the batch:
    an event whose insert has not committed yet has a smaller id than some committed ones, and
    the watermark must not pass it."""
    pending = ContributionEvent.objects.filter(id__gt=after)
    settle = now - datetime.timedelta(seconds=settings.CREDIT_ROLLUP_SETTLE_SECONDS)
    unsettled = pending.filter(received_at__gt=settle).order_by("id").values_list("id", flat=True).first()
    if unsettled is not None:
        pending = pending.filter(id__lt=unsettled)
    nth = pending.order_by("id").values_list("id", flat=True)[batch_size - 1:batch_size].first()
    return nth if nth is not None else pending.aggregate(last=Max("id"))["last"]


def credit_rollup_batch(*, batch_size: int) -> int:
    """Add the next events after the watermark to hourly buckets and totals (the volunteers' and
    their teams'), and move the watermark, in one transaction: all of it happens, or none."""
    now = timezone.now()
    with transaction.atomic():
        mark = watermark_lock()
        upper = _batch_upper_id(after=mark.event_id, batch_size=batch_size, now=now)
        if upper is None:
            return 0
        events = ContributionEvent.objects.filter(id__gt=mark.event_id, id__lte=upper)
        count = events.count()
        # The team is the volunteer's team now, read in the same statement as their events: the
        # work is the team's for good, whatever team the volunteer joins later (BOINC's rule).
        groups = list(
            events.values(run_id=F("session__run_id"), user_id=F("session__user_id"), team_id=F("session__user__team_id"),
                          hour=TruncHour("received_at"))
            .annotate(reported=Sum("samples"), last_seen=Max("received_at"), compute=Sum(report_seconds()))
        )
        pairs = _totals_add(groups)
        samples_added = defaultdict(int)
        for group in groups:
            samples_added[group["run_id"]] += group["reported"]
        run_credit_derive(pairs=pairs, now=now, teams={group["user_id"]: group["team_id"] for group in groups},
                          team_added=_team_added(groups), samples_added=samples_added)
        mark.event_id = upper
        mark.updated_at = now
        mark.save(update_fields=["event_id", "updated_at"])
    return count


def report_seconds():
    """The training time an event claims, as an expression over its row: samples / samples per
    second, at most COMPUTE_SECONDS_PER_REPORT_CAP."""
    seconds = Least(F("samples") * 1.0 / F("samples_per_second"), COMPUTE_SECONDS_PER_REPORT_CAP, output_field=FloatField())
    return Case(When(samples_per_second__gt=0, then=seconds), default=0.0, output_field=FloatField())


def credit_per_sample_of(run_ids: Iterable[int]) -> dict[int, float]:
    """Run id -> the credit of one of its samples."""
    return {run.pk: run_credit_per_sample(run) for run in Run.objects.filter(pk__in=set(run_ids)).only("config")}


def _buckets_add(*, confirmed: dict[tuple[int, int, datetime.datetime], int], teams: dict[int, int | None]) -> None:
    """Add samples confirmed ((run, user, hour) -> samples; negative when what was confirmed is
    taken back: flagged on new figures, rejected by an organizer) and their credit to the hourly
    buckets of the volunteers and of the teams they are in now: the 24 h and 7 d windows count
    credit by when it was confirmed."""
    cps = credit_per_sample_of(run_id for run_id, _, _ in confirmed)
    by_team: dict[tuple[int, int, datetime.datetime], int] = defaultdict(int)
    for (run_id, user_id, hour), samples in confirmed.items():
        if teams.get(user_id) is not None:
            by_team[(run_id, teams[user_id], hour)] += samples
    for model, owner, added in ((CreditHour, "user", confirmed), (TeamCreditHour, "team", by_team)):
        existing = {}
        hours = {hour for _, _, hour in added}
        for runs, owners in _chunks({(run_id, owner_id) for run_id, owner_id, _ in added}):
            for bucket in model.objects.filter(run_id__in=runs, **{f"{owner}_id__in": owners}, hour__in=hours):
                existing[(bucket.run_id, getattr(bucket, f"{owner}_id"), bucket.hour)] = bucket
        owed = {}
        for key, samples in added.items():
            bucket = existing.setdefault(key, model(run_id=key[0], **{f"{owner}_id": key[1]}, hour=key[2]))
            if bucket.samples + samples < 0:
                owed[key] = -(bucket.samples + samples)
            _bucket_add(bucket, max(samples, -bucket.samples), cps[key[0]])
        rows_upsert(model, list(existing.values()), ["run", owner, "hour"], ["samples", "credit"])
        for (run_id, owner_id, hour), samples in owed.items():
            _buckets_take_back(model.objects.filter(run_id=run_id, **{f"{owner}_id": owner_id}, hour__lt=hour),
                               samples=samples, cps=cps[run_id])


def _bucket_add(bucket, samples: int, cps: float) -> None:
    bucket.samples += samples
    bucket.credit = max(bucket.credit + samples * cps, 0.0) if bucket.samples else 0.0


def _buckets_take_back(earlier, *, samples: int, cps: float) -> None:
    """Take back what a take-back's own hour did not hold from the owner's earlier buckets, the
    latest first: the windows never keep credit that was taken back (runs/credit/rebuild.py checks
    it). What no bucket holds any more is gone with them."""
    taken = []
    for bucket in earlier.filter(samples__gt=0).order_by("-hour"):
        take = min(bucket.samples, samples)
        _bucket_add(bucket, -take, cps)
        taken.append(bucket)
        samples -= take
        if not samples:
            break
    earlier.model.objects.bulk_update(taken, ["samples", "credit"])


def _team_added(groups: list[dict]) -> dict[tuple[int, int], dict]:
    """What the batch adds to each (run, team): samples reported, compute time and last seen."""
    added: dict[tuple[int, int], dict] = defaultdict(dict)
    for group in groups:
        if group["team_id"] is None:
            continue
        sums = added[(group["run_id"], group["team_id"])]
        sums["samples"] = sums.get("samples", 0) + group["reported"]
        sums["compute_seconds"] = sums.get("compute_seconds", 0.0) + (group["compute"] or 0.0)
        sums["last_seen_at"] = max(filter(None, [sums.get("last_seen_at"), group["last_seen"]]))
    return added


def _totals_add(groups: list[dict]) -> set[tuple[int, int]]:
    """Add the batch's reported samples, compute time and last seen to each (run, user) total.
    Returns the pairs. Reported samples earn nothing yet: credit, the windows and RAC follow
    confirmations (run_credit_derive)."""
    added: dict[tuple[int, int], dict] = defaultdict(lambda: {"samples": 0, "compute": 0.0, "last_seen": None})
    for group in groups:
        sums = added[(group["run_id"], group["user_id"])]
        sums["samples"] += group["reported"]
        sums["compute"] += group["compute"] or 0.0
        sums["last_seen"] = max(filter(None, [sums["last_seen"], group["last_seen"]]))
    totals = _run_credits(added.keys())
    for (run_id, user_id), sums in added.items():
        total = totals.setdefault((run_id, user_id), RunCredit(run_id=run_id, user_id=user_id))
        total.samples += sums["samples"]
        total.compute_seconds += sums["compute"]
        total.last_seen_at = max(filter(None, [total.last_seen_at, sums["last_seen"]]))
    rows_upsert(RunCredit, list(totals.values()), ["run", "user"], ["samples", "compute_seconds", "last_seen_at"])
    return set(added)


def rows_upsert(model, rows: list, unique_fields: list[str], update_fields: list[str]) -> None:
    """Write back rows read earlier: INSERT … ON CONFLICT DO UPDATE is one statement per chunk on
    SQLite and PostgreSQL, where bulk_update's CASE per row grows slow with thousands of rows."""
    for row in rows:
        row.pk = None
    model.objects.bulk_create(rows, update_conflicts=True, unique_fields=unique_fields, update_fields=update_fields,
                              batch_size=CHUNK)


def _run_credits(pairs: Iterable[tuple[int, int]]) -> dict[tuple[int, int], RunCredit]:
    pairs = set(pairs)
    found = {}
    users = sorted({user_id for _, user_id in pairs})
    runs = {run_id for run_id, _ in pairs}
    for start in range(0, len(users), CHUNK):
        for total in RunCredit.objects.filter(run_id__in=runs, user_id__in=users[start:start + CHUNK]):
            if (total.run_id, total.user_id) in pairs:
                found[(total.run_id, total.user_id)] = total
    return found


def _chunks(pairs: set[tuple[int, int]]):
    """(run ids, user ids) filters covering the (run, user) pairs, a bounded number of users at a
    time; the same for (run, team) pairs."""
    users = sorted({user_id for _, user_id in pairs})
    runs = sorted({run_id for run_id, _ in pairs})
    for start in range(0, len(users), CHUNK):
        yield runs, users[start:start + CHUNK]


def run_credit_derive(*, pairs: set[tuple[int, int]], now: datetime.datetime, teams: dict[int, int | None] | None = None,
                      team_added: dict[tuple[int, int], dict] | None = None,
                      samples_added: dict[int, int] | None = None) -> None:
    """Recompute what follows from the events' totals for these (run, user) pairs: the verified,
    rejected and provisional split (SessionEpoch rows), the credit (the verified part), the 24 h /
    7 d windows and RAC (samples confirmed since the last call go into this hour's buckets and
    RAC's work), and the machines (agent tokens that reported); then the volunteers' all-runs
    totals. Idempotent: a second call finds nothing newly confirmed.

    Teams: what the recomputation changes in the split is added to the team each volunteer is in
    now (``teams``, user id -> team id, read here when not given), with ``team_added`` (the
    batch's new samples, by the team they were rolled up for).

    Runs: what the recomputation changes in the split and the windows is added to the run's
    totals, with ``samples_added`` (run id -> the batch's new samples), so that they stay the sum
    of the run's volunteer totals."""
    if not pairs:
        return
    totals = _run_credits(pairs)
    before = {key: [getattr(total, field) for field in SPLIT_FIELDS] for key, total in totals.items()}
    before_run = {key: [getattr(total, field) for field in RUN_DERIVED] for key, total in totals.items()}
    cps = credit_per_sample_of(run_id for run_id, _ in totals)
    if teams is None:
        teams = _teams_of({user_id for _, user_id in totals})
    epochs, windows, machines = {}, {}, {}
    for runs, users in _chunks(pairs):
        for row in _epoch_split(runs=runs, users=users):
            epochs[(row["run_id"], row["user_id"])] = row
        sessions = TrainingSession.objects.filter(run_id__in=runs, user_id__in=users).filter(_has_events)
        for row in sessions.values("run_id", "user_id").annotate(machines=Count("token", distinct=True)):
            machines[(row["run_id"], row["user_id"])] = row["machines"]
    rac_gained = {}
    for key, total in totals.items():
        split = epochs.get(key, {})
        verified_before = total.samples_verified
        for field, value in credit_split(samples=total.samples, verified=split.get("verified") or 0,
                                         rejected=split.get("rejected") or 0, cps=cps[key[0]]).items():
            setattr(total, field, value)
        total.machines = machines.get(key, 0)
        if total.samples_verified > verified_before:
            total.recent_average_credit, total.rac_updated_at, rac_gained[key] = rac_grant(
                average=total.recent_average_credit, updated_at=total.rac_updated_at,
                work=(total.samples_verified - verified_before) * cps[key[0]], now=now)
    for runs, users in _chunks(pairs):
        windows.update(_window_sums(CreditHour.objects.filter(run_id__in=runs, user_id__in=users), "user", now=now))
    for key, total in totals.items():
        _windows_set(total, windows.get(key, {}))
    rows_upsert(RunCredit, list(totals.values()), ["run", "user"],
            [*SPLIT_FIELDS, *(column.name for column in BUCKETED), "machines", *RAC_FIELDS])
    run_changes: dict[int, dict] = defaultdict(dict)
    for run_id, added in (samples_added or {}).items():
        run_changes[run_id]["samples"] = added
    for key, total in totals.items():
        change = run_changes[key[0]]
        for field, old in zip(RUN_DERIVED, before_run[key], strict=True):
            change[field] = change.get(field, 0) + getattr(total, field) - old
    run_credit_total_apply(changes=run_changes)
    volunteer_credit_refresh(user_ids={user_id for _, user_id in pairs}, now=now)
    changes: dict[tuple[int, int], dict] = defaultdict(dict, {key: dict(sums) for key, sums in (team_added or {}).items()})
    for key, total in totals.items():
        team_id = teams.get(key[1])
        if team_id is None:
            continue
        change = changes[(key[0], team_id)]
        for field, old in zip(SPLIT_FIELDS, before[key], strict=True):
            change[field] = change.get(field, 0) + getattr(total, field) - old
        if key in rac_gained:
            # A team's RAC is the sum of what its members gained while in it, decayed alike.
            change["rac"] = change.get("rac", 0.0) + rac_gained[key]
    run_team_credit_apply(changes=changes, now=now)
    team_members_refresh(team_ids={team_id for team_id in teams.values() if team_id is not None} | {t for _, t in changes})
    # Badges follow the totals just written, in the same transaction (runs/credit/milestones.py).
    milestones_refresh(holder="user", ids={user_id for _, user_id in pairs}, now=now)
    milestones_refresh(holder="team", ids={team_id for _, team_id in changes}, now=now)


def run_credit_total_apply(*, changes: dict[int, dict]) -> None:
    """Add the changes (run id -> field -> amount) to the runs' totals. Called only by the rollup,
    which holds the watermark lock, so no two passes add to the same row at once."""
    changes = {run_id: change for run_id, change in changes.items() if any(change.values())}
    if not changes:
        return
    totals = {total.run_id: total for total in RunCreditTotal.objects.filter(run_id__in=changes)}
    for run_id, change in changes.items():
        total = totals.setdefault(run_id, RunCreditTotal(run_id=run_id))
        for field, amount in change.items():
            setattr(total, field, getattr(total, field) + amount)
        # Added differences leave float rounding behind; a window with no samples has no credit.
        for samples_field, credit_field in (WINDOWS[column.window] for column in BUCKETED if column.measure == "credit"):
            if getattr(total, samples_field) == 0:
                setattr(total, credit_field, 0.0)
    rows_upsert(RunCreditTotal, list(totals.values()), ["run"], list(RUN_TOTAL))


def _teams_of(user_ids: set[int]) -> dict[int, int | None]:
    users = sorted(user_ids)
    teams = {}
    for start in range(0, len(users), CHUNK):
        teams.update(User.objects.filter(pk__in=users[start:start + CHUNK]).values_list("pk", "team_id"))
    return teams


def run_team_credit_apply(*, changes: dict[tuple[int, int], dict], now: datetime.datetime) -> None:
    """Add the changes to these (run, team) totals and recompute their 24 h / 7 d windows from
    the teams' hourly buckets; then the teams' all-runs totals. A change is a dict of field ->
    amount to add, plus ``rac`` (RAC gained) and ``last_seen_at``; an empty one only recomputes
    the windows."""
    if not changes:
        return
    keys = set(changes)
    totals, windows = {}, {}
    for runs, teams in _chunks(keys):
        for total in RunTeamCredit.objects.filter(run_id__in=runs, team_id__in=teams):
            if (total.run_id, total.team_id) in keys:
                totals[(total.run_id, total.team_id)] = total
        windows.update(_window_sums(TeamCreditHour.objects.filter(run_id__in=runs, team_id__in=teams), "team", now=now))
    for key, change in changes.items():
        total = totals.setdefault(key, RunTeamCredit(run_id=key[0], team_id=key[1]))
        for field in TEAM_ADDED:
            setattr(total, field, getattr(total, field) + change.get(field, 0))
        # A verification or rejection decided after a volunteer changed teams is applied to the
        # new team (see the docstring of RunTeamCredit); counts never go below zero there.
        total.samples_verified, total.samples_rejected = max(total.samples_verified, 0), max(total.samples_rejected, 0)
        if change.get("rac"):
            total.recent_average_credit = rac_now(average=total.recent_average_credit, updated_at=total.rac_updated_at,
                                                  now=now) + change["rac"]
            total.rac_updated_at = now
        total.last_seen_at = max(filter(None, [total.last_seen_at, change.get("last_seen_at")]), default=None)
        _windows_set(total, windows.get(key, {}))
    rows_upsert(RunTeamCredit, list(totals.values()), ["run", "team"], [*SUMMED, *ROW_FIELDS])
    team_credit_refresh(team_ids={team_id for _, team_id in keys}, now=now)


def _window_sums(buckets, owner: str, *, now: datetime.datetime) -> dict[tuple[int, int], dict]:
    """The bucketed columns of each (run, ``owner``) in these hourly buckets: their sums over each window."""
    starts = window_starts(now)
    sums = {column.name: Sum(column.measure, filter=Q(hour__gte=starts[column.window])) for column in BUCKETED}
    rows = buckets.filter(hour__gte=min(starts.values())).values("run_id", f"{owner}_id").annotate(**sums)
    return {(row["run_id"], row[f"{owner}_id"]): row for row in rows}


def _windows_set(total, sums: dict) -> None:
    for column in BUCKETED:
        setattr(total, column.name, sums.get(column.name) or column.zero)


_CONFIRMED_IN = {window: Q(**{f"{samples}__gt": 0}) for window, (samples, _) in WINDOWS.items()}
TEAM_COUNTS = {
    **{members: Count("pk", filter=_CONFIRMED_IN[window]) for window, (members, _) in TEAM_COUNTED.items()},
    **{machines: Sum("machines", filter=_CONFIRMED_IN[window]) for window, (_, machines) in TEAM_COUNTED.items()},
}


def team_members_refresh(*, team_ids: set[int]) -> None:
    """Recount what the team boards show of these teams' current members: those who contributed
    in each window, and their machines (as the boards did when they grouped the volunteers'
    totals by team per request), from the volunteers' totals, in each run and across runs."""
    teams = sorted(team_ids)
    for start in range(0, len(teams), CHUNK):
        chunk = teams[start:start + CHUNK]
        per_run, all_runs = (RunTeamCredit, RunCredit, ("run_id", "team_id")), (TeamCredit, VolunteerCredit, ("team_id",))
        for model, source, key in (per_run, all_runs):
            grouped = source.objects.filter(user__team_id__in=chunk).values(*key[:-1], team_id=F("user__team_id"))
            # annotated as counted_<field>: a name of the volunteers' columns cannot name an aggregate
            counted = grouped.annotate(**{f"counted_{field}": count for field, count in TEAM_COUNTS.items()})
            counts = {tuple(row[field] for field in key): row for row in counted}
            rows = list(model.objects.filter(team_id__in=chunk))
            for row in rows:
                found = counts.get(tuple(getattr(row, field) for field in key), {})
                for field in TEAM_COUNTS:
                    setattr(row, field, found.get(f"counted_{field}") or 0)
            rows_upsert(model, rows, [field.removesuffix("_id") for field in key], list(TEAM_COUNTS))


def credit_teams_refresh() -> int:
    """Recount the members of the teams volunteers joined or left since the last pass (team
    changes happen outside the rollup; credit stays where it was earned). Returns the teams."""
    now = timezone.now()
    with transaction.atomic():
        mark = watermark_lock()
        changed = TeamEvent.objects.filter(kind__in=[TeamEvent.Kind.JOINED, TeamEvent.Kind.LEFT])
        if mark.teams_checked_at is not None:
            changed = changed.filter(at__gte=mark.teams_checked_at - EPOCH_CHANGES_OVERLAP)
        team_ids = set(changed.values_list("team_id", flat=True).distinct())
        team_members_refresh(team_ids=team_ids)
        mark.teams_checked_at = now
        mark.save(update_fields=["teams_checked_at"])
    return len(team_ids)


def team_credit_refresh(*, team_ids: set[int], now: datetime.datetime) -> None:
    """A team's all-runs totals: sums of its runs' totals (RAC as for volunteers)."""
    teams = sorted(team_ids)
    for start in range(0, len(teams), CHUNK):
        rows: dict[int, TeamCredit] = {}
        for total in RunTeamCredit.objects.filter(team_id__in=teams[start:start + CHUNK]):
            row = rows.setdefault(total.team_id, TeamCredit(team_id=total.team_id, rac_updated_at=now))
            for field in SUMMED:
                setattr(row, field, getattr(row, field) + getattr(total, field))
            row.recent_average_credit += rac_now(average=total.recent_average_credit, updated_at=total.rac_updated_at, now=now)
            row.last_seen_at = max(filter(None, [row.last_seen_at, total.last_seen_at]), default=None)
        rows_upsert(TeamCredit, list(rows.values()), ["team"], [*SUMMED, *ROW_FIELDS])


def _epoch_split(*, runs: list[int], users: list[int]):
    """Verified and rejected samples per (run, user): a verified epoch counts the smaller of the
    reported and the announced samples, an accepted one what was reported; rejected earns nothing."""
    status = SessionEpoch.Status
    verified = Case(
        When(status=status.VERIFIED, announced_samples__isnull=False,
             then=Least("reported_samples", "announced_samples")),
        When(status__in=[status.VERIFIED, status.ACCEPTED], then=F("reported_samples")),
        default=0,
    )
    rejected = Case(When(status=status.REJECTED, then=F("reported_samples")), default=0)
    return (
        SessionEpoch.objects.filter(session__run_id__in=runs, session__user_id__in=users)
        .values(run_id=F("session__run_id"), user_id=F("session__user_id"))
        .annotate(verified=Sum(verified), rejected=Sum(rejected))
    )


def volunteer_credit_refresh(*, user_ids: set[int], now: datetime.datetime) -> None:
    """A volunteer's all-runs totals: sums of their runs' totals. RAC decays the same way in
    every run, so the all-runs RAC is the sum of the runs' RACs decayed to the same moment."""
    users = sorted(user_ids)
    for start in range(0, len(users), CHUNK):
        chunk = users[start:start + CHUNK]
        rows: dict[int, VolunteerCredit] = {}
        for total in RunCredit.objects.filter(user_id__in=chunk):
            row = rows.setdefault(total.user_id, VolunteerCredit(user_id=total.user_id, rac_updated_at=now))
            for field in SUMMED:
                setattr(row, field, getattr(row, field) + getattr(total, field))
            row.recent_average_credit += rac_now(average=total.recent_average_credit, updated_at=total.rac_updated_at, now=now)
            row.last_seen_at = max(filter(None, [row.last_seen_at, total.last_seen_at]), default=None)
        sessions = TrainingSession.objects.filter(user_id__in=chunk).filter(_has_events)
        for row in sessions.values("user_id").annotate(machines=Count("token", distinct=True)):
            if row["user_id"] in rows:
                rows[row["user_id"]].machines = row["machines"]
        VolunteerCredit.objects.bulk_create(
            list(rows.values()), update_conflicts=True, unique_fields=["user"],
            update_fields=[*SUMMED, *ROW_FIELDS, "machines"],
            batch_size=CHUNK,
        )


def credit_epochs_refresh() -> int:
    """Apply the monitor's and organizers' SessionEpoch changes since the last pass: date what each
    changed epoch newly confirmed (or an organizer took back) into the hourly buckets, then
    recompute the verified/provisional split. Returns the (run, user) pairs refreshed."""
    now = timezone.now()
    with transaction.atomic():
        mark = watermark_lock()
        changed = SessionEpoch.objects.all()
        if mark.epochs_checked_at is not None:
            since = mark.epochs_checked_at - EPOCH_CHANGES_OVERLAP
            changed = changed.filter(Q(checked_at__gte=since) | Q(decided_at__gte=since))
        else:
            changed = changed.exclude(checked_at=None, decided_at=None)
        pairs = set()
        rows = changed.values_list("pk", "session__run_id", "session__user_id", "status", "reported_samples",
                                   "announced_samples", "checked_at", "decided_at", "credited_samples")
        for chunk in _batches(rows.order_by("pk").iterator(chunk_size=CHUNK), CHUNK):
            pairs |= _confirmations_date(chunk, now=now)
        run_credit_derive(pairs=pairs, now=now)
        mark.epochs_checked_at = now
        mark.save(update_fields=["epochs_checked_at"])
    return len(pairs)


def _batches(rows: Iterable, size: int):
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _confirmations_date(rows: list[tuple], *, now: datetime.datetime) -> set[tuple[int, int]]:
    """Bucket what these SessionEpoch rows confirmed since the rollup last counted them, by the hour
    the coordinator confirmed it (an organizer's decision: when it was taken). Returns their pairs."""
    confirmed: dict[tuple[int, int, datetime.datetime], int] = defaultdict(int)
    counted = []
    pairs = set()
    for pk, run_id, user_id, status, reported, announced, checked_at, decided_at, credited in rows:
        pairs.add((run_id, user_id))
        samples = epoch_confirmed_samples(status=status, reported=reported, announced=announced)
        if samples != credited:
            confirmed[(run_id, user_id, hour_start(decided_at or checked_at or now))] += samples - credited
            counted.append(SessionEpoch(pk=pk, credited_samples=samples))
    if confirmed:
        _buckets_add(confirmed=confirmed, teams=_teams_of({user_id for _, user_id, _ in confirmed}))
        SessionEpoch.objects.bulk_update(counted, ["credited_samples"], batch_size=CHUNK)
    return pairs


def credit_windows_age() -> int:
    """Drop the hours that left the 24 h and 7 d windows since the last pass, also for volunteers
    who sent nothing since. Returns the (run, user) pairs refreshed."""
    now = timezone.now()
    with transaction.atomic():
        mark = watermark_lock()
        if mark.windows_hour == hour_start(now):
            return 0
        new, old = window_starts(now), window_starts(mark.windows_hour or now - datetime.timedelta(days=8))
        aged = CreditHour.objects.filter(
            Q(hour__gte=old["24h"], hour__lt=new["24h"]) | Q(hour__gte=old["7d"], hour__lt=new["7d"])
        )
        pairs = set(aged.values_list("run_id", "user_id").distinct())
        run_credit_derive(pairs=pairs, now=now)
        team_aged = TeamCreditHour.objects.filter(
            Q(hour__gte=old["24h"], hour__lt=new["24h"]) | Q(hour__gte=old["7d"], hour__lt=new["7d"])
        )
        run_team_credit_apply(changes={pair: {} for pair in team_aged.values_list("run_id", "team_id").distinct()}, now=now)
        mark.windows_hour = hour_start(now)
        mark.save(update_fields=["windows_hour"])
    return len(pairs)


def credit_rac_decay() -> int:
    """Decay the RAC of volunteers and teams who earned nothing for an hour, so that boards sorted
    by RAC stay right for idle ones. Returns the rows decayed. Each batch holds the rollup's lock:
    a pass that grants one of them RAC between the batch's read and its write would be overwritten."""
    now = timezone.now()
    decayed = 0
    unique = {RunCredit: ["run", "user"], VolunteerCredit: ["user"], RunTeamCredit: ["run", "team"], TeamCredit: ["team"]}
    for model, unique_fields in unique.items():
        idle = model.objects.filter(rac_updated_at__lt=now - datetime.timedelta(hours=1), recent_average_credit__gt=0)
        while True:
            with transaction.atomic():
                watermark_lock()
                batch = list(idle.order_by("pk")[:CHUNK])
                for row in batch:
                    row.recent_average_credit, row.rac_updated_at = rac_update(
                        average=row.recent_average_credit, updated_at=row.rac_updated_at, work=0.0, now=now)
                rows_upsert(model, batch, unique_fields, ["recent_average_credit", "rac_updated_at"])
            if not batch:
                break
            decayed += len(batch)
    return decayed
