"""What every credit aggregate should hold, recounted from the record instead of by adding differences
as the rollup (runs/credit/rollup.py) does. The record: the contribution events the rollup has taken
in (up to its watermark), the SessionEpoch decisions, and the teams' joins and leaves (TeamEvent).
runs/credit/rebuild.py compares the recount with what is stored, and writes it.

The record decides a volunteer's samples, compute time, last seen, machines and verified / rejected /
provisional split in each run, their sums across runs and over a run, and which of a team's current
members count. These are recounted exactly.

The rest is *dated*: it depends on when the rollup applied each change, which no table keeps. The
hourly buckets (confirmed work counts in the hour of its decision) and the 24 h / 7 d windows summed
from them, RAC (granted when the rollup sees credit confirmed), and what each team holds (the team
its volunteer was in when the rollup took a report or a decision in). With ``history`` these are
recounted as the rollup reaches them when it keeps up: a report counts when it was received, a
decision when it was taken (``decided_at``, else ``checked_at``). That is not what the rollup stored
where it fell behind a team change, where an epoch was judged more than once (only the last decision
is on record), or for RAC after an idle decay (``credit_rac_decay`` restarts BOINC's interval).
Without ``history`` the stored dated figures are kept as they are, and what follows from them is
recounted: the windows from the buckets, the all-runs and run totals from their parts, the RACs
summed.
"""

import bisect
import datetime
from collections import defaultdict
from itertools import groupby

from django.db.models import Count, Exists, F, Max, OuterRef, Sum
from django.db.models.functions import TruncHour

from accounts.models import TeamEvent, User
from runs.credit.columns import (
    BUCKETED,
    RAC_FIELDS,
    ROW_FIELDS,
    RUN_TOTAL,
    SPLIT_FIELDS,
    SUMMED,
    TEAM_ADDED,
    TEAM_COUNTED,
    WINDOWS,
    ZEROS,
)
from runs.credit.rollup import (
    CHUNK,
    credit_per_sample_of,
    credit_split,
    hour_start,
    rac_grant,
    rac_now,
    report_seconds,
    window_starts,
)
from runs.models import (
    ContributionEvent,
    CreditHour,
    CreditRollup,
    RunCredit,
    RunCreditTotal,
    RunTeamCredit,
    SessionEpoch,
    TeamCredit,
    TeamCreditHour,
    TrainingSession,
    VolunteerCredit,
    epoch_confirmed_samples,
    epoch_rejected_samples,
)

HOUR = datetime.timedelta(hours=1)
TEAM_COUNT_FIELDS = tuple(field for pair in TEAM_COUNTED.values() for field in pair)
VOLUNTEER_FIELDS = (*SUMMED, *ROW_FIELDS, "machines")
TEAM_FIELDS = (*SUMMED, *ROW_FIELDS, *TEAM_COUNT_FIELDS)
BUCKET_FIELDS = ("samples", "credit")
# table -> (model, key columns, figures), in the order the rebuild writes them
TABLES = {
    "RunCredit": (RunCredit, ("run_id", "user_id"), VOLUNTEER_FIELDS),
    "VolunteerCredit": (VolunteerCredit, ("user_id",), VOLUNTEER_FIELDS),
    "RunCreditTotal": (RunCreditTotal, ("run_id",), RUN_TOTAL),
    "CreditHour": (CreditHour, ("run_id", "user_id", "hour"), BUCKET_FIELDS),
    "RunTeamCredit": (RunTeamCredit, ("run_id", "team_id"), TEAM_FIELDS),
    "TeamCredit": (TeamCredit, ("team_id",), TEAM_FIELDS),
    "TeamCreditHour": (TeamCreditHour, ("run_id", "team_id", "hour"), BUCKET_FIELDS),
    "SessionEpoch": (SessionEpoch, ("id",), ("credited_samples",)),
}
RUN_TABLES = ("RunCredit", "RunCreditTotal", "CreditHour", "RunTeamCredit", "TeamCreditHour", "SessionEpoch")

Figures = dict[str, dict[tuple, dict]]


class TeamHistory:
    """The team each volunteer was in at a moment, from the joins and leaves on record (TeamEvent).
    Before their first one they were in the team it leaves, if it is a leave; a volunteer with none
    is in their current team for good (the only history there is, as migration 0007 assumed)."""

    def __init__(self):
        self.current = dict(User.objects.exclude(team=None).values_list("pk", "team_id"))
        self._moments: dict[int, list[datetime.datetime]] = defaultdict(list)
        self._teams: dict[int, list[int | None]] = defaultdict(list)
        self._before: dict[int, int | None] = {}
        kinds = {TeamEvent.Kind.JOINED: True, TeamEvent.Kind.LEFT: False}
        changes = TeamEvent.objects.filter(kind__in=kinds).exclude(user=None).order_by("at", "id")
        for user_id, team_id, kind, at in changes.values_list("user_id", "team_id", "kind", "at").iterator(chunk_size=CHUNK):
            self._before.setdefault(user_id, None if kinds[kind] else team_id)
            self._moments[user_id].append(at)
            self._teams[user_id].append(team_id if kinds[kind] else None)

    def at(self, user_id: int, moment: datetime.datetime) -> int | None:
        if user_id not in self._before:
            return self.current.get(user_id)
        index = bisect.bisect_right(self._moments[user_id], moment)
        return self._teams[user_id][index - 1] if index else self._before[user_id]

    def changed_within(self, user_id: int, start: datetime.datetime, end: datetime.datetime) -> bool:
        moments = self._moments.get(user_id, [])
        return bisect.bisect_left(moments, start) < bisect.bisect_left(moments, end)


def stored_figures(name: str, queryset=None) -> dict[tuple, dict]:
    """What table ``name`` holds (of the rows of ``queryset``), keyed as the recount keys it; each
    row's ``id`` rides along for the rebuild."""
    model, key, fields = TABLES[name]
    rows = (queryset if queryset is not None else model.objects.all()).values(*dict.fromkeys(("id", *key, *fields)))
    return {tuple(row[column] for column in key): row for row in rows.iterator(chunk_size=CHUNK)}


def _stored_among(name: str, column: str, ids: set[int]) -> dict[tuple, dict]:
    model = TABLES[name][0]
    found = {}
    ordered = sorted(ids)
    for start in range(0, len(ordered), CHUNK):
        found.update(stored_figures(name, model.objects.filter(**{f"{column}__in": ordered[start:start + CHUNK]})))
    return found


def credit_recount(*, run_id: int | None = None, now: datetime.datetime, history: bool = True) -> tuple[Figures, Figures]:
    """(what the aggregates should hold, what they hold): of one run (its volunteers' and teams'
    rows, their all-runs totals, its epochs' credited samples) or of all runs. Run it in the
    transaction that holds the rollup's lock (rollup.watermark_lock), so no pass moves underneath."""
    through = CreditRollup.objects.get_or_create(pk=1)[0].event_id
    stored = {name: stored_figures(name, _in_run(TABLES[name][0].objects.all(), run_id, name)) for name in RUN_TABLES}
    teams = TeamHistory()
    events = _in_run(ContributionEvent.objects.filter(id__lte=through), run_id, "ContributionEvent")
    epochs = list(_decisions(_in_run(SessionEpoch.objects.all(), run_id, "SessionEpoch"), now=now))
    volunteers, team_reported = _reported(events, teams)
    cps = credit_per_sample_of({run for run, _ in volunteers} | {row[1] for row in epochs})
    team_sums = {key: {**sums, "credit_provisional": sums["samples"] * cps[key[0]]} for key, sums in team_reported.items()}
    rac_grants = _splits(volunteers, epochs, teams, team_sums, cps)
    for key, machines in _machines(events, ("session__run_id", "session__user_id")).items():
        if key in volunteers:
            volunteers[key]["machines"] = machines
    recounted: Figures = {"SessionEpoch": {(pk,): {"credited_samples": confirmed if stamped else 0}
                                         for pk, _, _, _, stamped, confirmed, _ in epochs}}
    if history:
        recounted["CreditHour"], recounted["TeamCreditHour"] = _buckets(epochs, teams, cps)
        team_rows = _team_rows(team_sums, rac_grants, recounted["TeamCreditHour"])
    else:
        recounted["CreditHour"], recounted["TeamCreditHour"] = stored["CreditHour"], stored["TeamCreditHour"]
        for key, total in volunteers.items():
            kept = stored["RunCredit"].get(key, {"recent_average_credit": 0.0, "rac_updated_at": None})
            total.update({field: kept[field] for field in RAC_FIELDS})
        team_rows = {key: {field: row[field] for field in (*TEAM_ADDED, *ROW_FIELDS)}
                     for key, row in stored["RunTeamCredit"].items()}
    _windows_add(volunteers, recounted["CreditHour"], now=now)
    _windows_add(team_rows, recounted["TeamCreditHour"], now=now)
    recounted["RunCredit"], recounted["RunTeamCredit"] = volunteers, team_rows
    recounted["RunCreditTotal"] = _run_totals(volunteers)
    _all_runs(recounted, stored, run_id=run_id, through=through, teams=teams, now=now)
    return recounted, stored


def _in_run(queryset, run_id: int | None, name: str):
    if run_id is None:
        return queryset
    by_session = name in ("ContributionEvent", "SessionEpoch")
    return queryset.filter(session__run_id=run_id) if by_session else queryset.filter(run_id=run_id)


def _reported(events, teams: TeamHistory) -> tuple[dict, dict]:
    """Samples, compute time and last seen of each (run, user) in the events, and of each (run,
    team), each report counted for the team its volunteer was in when it was received. Read per
    hour; an hour in which the volunteer changed teams, report by report."""
    per_user: dict[tuple, dict] = defaultdict(lambda: {**_reported_zero(), "machines": 0, "recent_average_credit": 0.0,
                                                       "rac_updated_at": None})
    per_team: dict[tuple, dict] = defaultdict(_reported_zero)
    hourly = (events.values(run_id=F("session__run_id"), user_id=F("session__user_id"), hour=TruncHour("received_at"))
              .annotate(reported=Sum("samples"), compute=Sum(report_seconds()), last_seen=Max("received_at")))
    for row in hourly.order_by().iterator(chunk_size=CHUNK):
        run_id, user_id, hour = row["run_id"], row["user_id"], row["hour"]
        _reported_add(per_user[(run_id, user_id)], row["reported"], row["compute"], row["last_seen"])
        if teams.changed_within(user_id, hour, hour + HOUR):
            reports = events.filter(session__run_id=run_id, session__user_id=user_id, received_at__gte=hour,
                                    received_at__lt=hour + HOUR).annotate(seconds=report_seconds())
            parts = [(teams.at(user_id, at), samples, seconds, at)
                     for samples, seconds, at in reports.values_list("samples", "seconds", "received_at")]
        else:
            parts = [(teams.at(user_id, hour), row["reported"], row["compute"], row["last_seen"])]
        for team_id, samples, seconds, last_seen in parts:
            if team_id is not None:
                _reported_add(per_team[(run_id, team_id)], samples, seconds, last_seen)
    return dict(per_user), dict(per_team)


def _reported_zero() -> dict:
    return {"samples": 0, "compute_seconds": 0.0, "last_seen_at": None}


def _reported_add(sums: dict, samples: int, seconds: float | None, last_seen: datetime.datetime) -> None:
    sums["samples"] += samples
    sums["compute_seconds"] += seconds or 0.0
    sums["last_seen_at"] = max(filter(None, [sums["last_seen_at"], last_seen]))


def _decisions(epochs, *, now: datetime.datetime):
    """(pk, run, user, when, stamped, confirmed, rejected) of each SessionEpoch row, ``when`` the
    moment of its decision (an organizer's, else the monitor's; runs.credit.rollup dates
    confirmations the same way), ``now`` for a row that records none."""
    rows = epochs.values_list("pk", "session__run_id", "session__user_id", "status", "reported_samples",
                              "announced_samples", "checked_at", "decided_at")
    for pk, run_id, user_id, status, reported, announced, checked_at, decided_at in rows.iterator(chunk_size=CHUNK):
        stamped = decided_at or checked_at
        yield (pk, run_id, user_id, stamped or now, stamped is not None,
               epoch_confirmed_samples(status=status, reported=reported, announced=announced),
               epoch_rejected_samples(status=status, reported=reported))


def _splits(volunteers: dict, epochs: list, teams: TeamHistory, team_sums: dict, cps: dict) -> dict:
    """Each volunteer's split (runs.credit.rollup.credit_split) and RAC, replaying their decisions in
    the order they were taken; what each decision moved goes to the team the volunteer was in then.
    Returns the RAC each (run, team) gained: (moment, amount) pairs."""
    grants = defaultdict(list)
    by_pair = sorted((row for row in epochs if (row[1], row[2]) in volunteers), key=lambda row: (row[1], row[2], row[3]))
    for key, total in volunteers.items():
        total.update(credit_split(samples=total["samples"], verified=0, rejected=0, cps=cps[key[0]]))
    for (run_id, user_id), rows in groupby(by_pair, key=lambda row: (row[1], row[2])):
        total = volunteers[(run_id, user_id)]
        confirmed = rejected = 0
        for when, moment in groupby(rows, key=lambda row: row[3]):
            for *_, confirms, rejects in moment:
                confirmed, rejected = confirmed + confirms, rejected + rejects
            split = credit_split(samples=total["samples"], verified=confirmed, rejected=rejected, cps=cps[run_id])
            team_id = teams.at(user_id, when)
            if team_id is not None:
                sums = team_sums.setdefault((run_id, team_id), {})
                for field in SPLIT_FIELDS:
                    sums[field] = sums.get(field, 0) + split[field] - total[field]
            gained = split["samples_verified"] - total["samples_verified"]
            if gained > 0:
                total["recent_average_credit"], total["rac_updated_at"], rac = rac_grant(
                    average=total["recent_average_credit"], updated_at=total["rac_updated_at"],
                    work=gained * cps[run_id], now=when)
                if team_id is not None:
                    grants[(run_id, team_id)].append((when, rac))
            total.update(split)
    return grants


def _machines(events, key: tuple[str, ...]) -> dict[tuple, int]:
    """Distinct agent tokens that reported, per ``key`` (the session's run and user, or its user)."""
    reported = Exists(events.filter(session=OuterRef("pk")))
    sessions = TrainingSession.objects.filter(reported).values(*(column.removeprefix("session__") for column in key))
    return {tuple(row.values())[:-1]: row["machines"] for row in sessions.annotate(machines=Count("token", distinct=True))}


def _buckets(epochs: list, teams: TeamHistory, cps: dict) -> tuple[dict, dict]:
    """Hourly buckets of the volunteers and of their teams: each epoch's confirmed samples in the
    hour of its decision, for the team the volunteer was in then."""
    volunteers: dict[tuple, dict] = defaultdict(lambda: {"samples": 0, "credit": 0.0})
    by_team: dict[tuple, dict] = defaultdict(lambda: {"samples": 0, "credit": 0.0})
    for _, run_id, user_id, when, stamped, confirmed, _ in epochs:
        if not (stamped and confirmed):
            continue
        owners = [(volunteers, user_id)]
        if (team_id := teams.at(user_id, when)) is not None:
            owners.append((by_team, team_id))
        for buckets, owner in owners:
            bucket = buckets[(run_id, owner, hour_start(when))]
            bucket["samples"] += confirmed
            bucket["credit"] += confirmed * cps[run_id]
    return dict(volunteers), dict(by_team)


def _team_rows(team_sums: dict, rac_grants: dict, buckets: dict) -> dict[tuple, dict]:
    """A team's totals in a run: what its members' reports and decisions added while in it (its
    counts never below zero, as the rollup keeps them), RAC from what they gained."""
    keys = set(team_sums) | set(rac_grants) | {(run_id, team_id) for run_id, team_id, _ in buckets}
    rows = {}
    for key in keys:
        row = {field: team_sums.get(key, {}).get(field, ZEROS[field]) for field in TEAM_ADDED}
        row["samples_verified"], row["samples_rejected"] = max(row["samples_verified"], 0), max(row["samples_rejected"], 0)
        row["last_seen_at"] = team_sums.get(key, {}).get("last_seen_at")
        row["recent_average_credit"], row["rac_updated_at"] = 0.0, None
        for when, gained in sorted(rac_grants.get(key, [])):
            row["recent_average_credit"] = rac_now(average=row["recent_average_credit"], updated_at=row["rac_updated_at"],
                                                   now=when) + gained
            row["rac_updated_at"] = when
        rows[key] = row
    return rows


def _windows_add(totals: dict[tuple, dict], buckets: dict[tuple, dict], *, now: datetime.datetime) -> None:
    """The bucketed columns (columns.BUCKETED) of each (run, owner) total: its buckets' sums over each window."""
    starts = window_starts(now)
    for total in totals.values():
        total.update({column.name: column.zero for column in BUCKETED})
    for (run_id, owner, hour), bucket in buckets.items():
        if (run_id, owner) in totals:
            for column in BUCKETED:
                if hour >= starts[column.window]:
                    totals[(run_id, owner)][column.name] += bucket[column.measure]


def _run_totals(volunteers: dict[tuple, dict]) -> dict[tuple, dict]:
    totals: dict[tuple, dict] = defaultdict(lambda: {field: ZEROS[field] for field in RUN_TOTAL})
    for (run_id, _), total in volunteers.items():
        for field in RUN_TOTAL:
            totals[(run_id,)][field] += total[field]
    return dict(totals)


def _all_runs(recounted: Figures, stored: Figures, *, run_id: int | None, through: int, teams: TeamHistory,
              now: datetime.datetime) -> None:
    """The volunteers' and the teams' all-runs totals, and the team counts: of everyone, or of the
    run's volunteers and teams, with their rows in other runs as stored."""
    users = {user_id for _, user_id in (*recounted["RunCredit"], *stored["RunCredit"])}
    team_ids = {team_id for _, team_id in (*recounted["RunTeamCredit"], *stored["RunTeamCredit"])}
    team_ids |= {teams.current[user_id] for user_id in users if user_id in teams.current}
    members = defaultdict(list)
    for user_id, team_id in teams.current.items():
        members[team_id].append(user_id)
    volunteer_runs, team_runs = dict(recounted["RunCredit"]), dict(recounted["RunTeamCredit"])
    consumed = ContributionEvent.objects.filter(id__lte=through)
    if run_id is None:
        stored["VolunteerCredit"], stored["TeamCredit"] = stored_figures("VolunteerCredit"), stored_figures("TeamCredit")
        machines, others = _machines(consumed, ("session__user_id",)), {}
    else:
        stored["VolunteerCredit"] = _stored_among("VolunteerCredit", "user_id", users)
        stored["TeamCredit"] = _stored_among("TeamCredit", "team_id", team_ids)
        volunteer_runs |= {key: row for key, row in _stored_among("RunCredit", "user_id", users).items() if key[0] != run_id}
        team_runs |= {key: row for key, row in _stored_among("RunTeamCredit", "team_id", team_ids).items() if key[0] != run_id}
        ordered = sorted(users)
        machines = {}
        for start in range(0, len(ordered), CHUNK):
            machines |= _machines(consumed.filter(session__user_id__in=ordered[start:start + CHUNK]), ("session__user_id",))
        others = _stored_among("VolunteerCredit", "user_id", {user for team in team_ids for user in members[team]} - users)
    recounted["VolunteerCredit"] = _sums(volunteer_runs, users if run_id is not None else None, now=now)
    for (user_id,), total in recounted["VolunteerCredit"].items():
        total["machines"] = machines.get((user_id,), 0)
    recounted["TeamCredit"] = _sums(team_runs, team_ids if run_id is not None else None, now=now)
    everyone = {**others, **recounted["VolunteerCredit"]}
    for (run, team_id), row in recounted["RunTeamCredit"].items():
        row.update(_counts([volunteer_runs.get((run, user)) for user in members[team_id]]))
    for (team_id,), row in recounted["TeamCredit"].items():
        row.update(_counts([everyone.get((user,)) for user in members[team_id]]))


def _sums(runs: dict[tuple, dict], owners: set[int] | None, *, now: datetime.datetime) -> dict[tuple, dict]:
    """All-runs totals of each owner (the last part of the key) from their runs' totals: the sums,
    the RACs decayed to ``now`` and summed, the latest last seen."""
    totals = {}
    for (_, owner), row in runs.items():
        if owners is not None and owner not in owners:
            continue
        total = totals.setdefault((owner,), {**ZEROS, "recent_average_credit": 0.0, "rac_updated_at": now, "last_seen_at": None})
        for field in SUMMED:
            total[field] += row[field]
        total["recent_average_credit"] += rac_now(average=row["recent_average_credit"],
                                                  updated_at=row["rac_updated_at"], now=now)
        total["last_seen_at"] = max(filter(None, [total["last_seen_at"], row["last_seen_at"]]), default=None)
    return totals


def _counts(members: list[dict | None]) -> dict[str, int]:
    """A team's members who contributed in each window, and their machines (rollup.TEAM_COUNTS)."""
    counts = {}
    for window, (members_field, machines_field) in TEAM_COUNTED.items():
        counted = [row for row in members if row is not None and row[WINDOWS[window][0]] > 0]
        counts[members_field], counts[machines_field] = len(counted), sum(row["machines"] for row in counted)
    return counts
