"""Team totals the rollup keeps (RunTeamCredit, TeamCredit, TeamCreditHour): the team boards read
them, and they equal the old request-time grouping of the volunteers' totals by team, except that
a volunteer who changes teams leaves their past work with the old team (BOINC's rule)."""

import datetime
from collections import defaultdict

import pytest
from django.apps import apps
from django.db.models import Count, Max, Sum
from django.utils import timezone

from accounts.services import team_create, team_disband, team_join, team_leave
from runs import tasks
from runs.credit import columns, exports, rollup
from runs.credit.boards import WINDOWS, leaderboard_rows
from runs.credit.rollup import credit_rollup
from runs.models import RunCredit, RunCreditTotal, RunTeamCredit, SessionEpoch, TeamCredit, TeamCreditHour, VolunteerCredit
from tests.factories import NOW, RunFactory, UserFactory, report, session_for

HOUR = datetime.timedelta(hours=1)
COMPARED = ["name", "samples", "credit", "credit_verified", "recent_average_credit",
            "compute_seconds", "last_seen", "machines", "members", "rank", "share"]



def grouped_team_board(run, window: str) -> list[dict]:
    """The team board as it was computed before team totals existed: the volunteers' totals
    grouped by their current team on every request. (It summed the stored RACs; the sum of the
    RACs decayed to now is what it meant to show, and what the board shows now.)"""
    samples_column, credit_column = WINDOWS[window]
    totals = (RunCredit.objects.filter(run=run) if run else VolunteerCredit.objects.all()).filter(**{f"{samples_column}__gt": 0})
    board = totals.aggregate(credit=Sum(credit_column))["credit"] or 0.0
    teams = (
        totals.exclude(user__team=None).values("user__team__name")
        .annotate(samples=Sum(samples_column), credit=Sum(credit_column),
                  credit_verified=Sum("credit_verified"), recent_average_credit=Sum("recent_average_credit"),
                  compute_seconds=Sum("compute_seconds"), last_seen=Max("last_seen_at"), machines=Sum("machines"),
                  members=Count("user_id"))
        .order_by("-credit", "user__team_id")
    )
    rac = defaultdict(float)
    for total in totals.exclude(user__team=None).select_related("user__team"):
        rac[total.user.team.name] += rollup.rac_now(average=total.recent_average_credit, updated_at=total.rac_updated_at)
    return [{**team, "name": team["user__team__name"], "rank": rank, "share": team["credit"] / board,
             "recent_average_credit": rac[team["user__team__name"]]} for rank, team in enumerate(teams, start=1)]


def assert_same_board(rows: list[dict], expected: list[dict]) -> None:
    assert [row["name"] for row in rows] == [row["name"] for row in expected]
    for row, old in zip(rows, expected, strict=True):
        for field in COMPARED:
            expected = pytest.approx(old[field]) if isinstance(old[field], float) else old[field]
            assert row[field] == expected, (row["name"], field)


@pytest.mark.parametrize("window", ["all", "24h", "7d"])
@pytest.mark.parametrize("run_slug", ["small", "big", None])
def test_team_boards_equal_the_old_grouping_when_nobody_changes_teams(teams, window, run_slug):
    run = {"small": teams[0], "big": teams[1], None: None}[run_slug]
    rows = leaderboard_rows(run=run, by="team", window=window)
    assert rows, "every window has teams"
    assert_same_board(rows, grouped_team_board(run, window))


def test_team_totals_across_runs_add_up_runs_of_different_sizes(teams):
    small, big, dhaka, lima = teams
    cps_small, cps_big = rollup.run_credit_per_sample(small), rollup.run_credit_per_sample(big)
    total = TeamCredit.objects.get(team=dhaka)
    assert total.samples == 300 + 30 + 120 + 50 + 7
    assert total.credit == pytest.approx((300 + 30 + 120 + 50) * cps_small + 7 * cps_big)
    assert (total.samples_24h, total.samples_7d) == (30 + 120 + 50 + 7, 30 + 120 + 50 + 7)
    [row] = [row for row in leaderboard_rows(run=None, by="team") if row["name"] == "Dhaka Compute"]
    assert (row["members"], row["machines"]) == (3, 5), "hidden members count; amina has three machines in two runs"


def test_a_volunteer_who_changes_teams_leaves_past_work_with_the_old_team(teams, clock):
    small, big, dhaka, lima = teams
    bo = dhaka.members.get(username="bo")
    team_join(user=bo, team=lima)  # mid-run
    report(session_for(small, bo, machine="bo-new"), 60, at=NOW)
    clock.now = NOW + datetime.timedelta(minutes=5)
    credit_rollup()
    cps = rollup.run_credit_per_sample(small)
    dhaka_total, lima_total = RunTeamCredit.objects.get(run=small, team=dhaka), RunTeamCredit.objects.get(run=small, team=lima)
    assert dhaka_total.samples == 300 + 30 + 120 + 50 and dhaka_total.samples_24h == 30 + 120 + 50
    assert lima_total.samples == 400 + 60 and lima_total.samples_24h == 60
    assert lima_total.credit == pytest.approx(460 * cps)
    rows = {row["name"]: row for row in leaderboard_rows(run=small, by="team", window="24h")}
    old = {row["name"]: row for row in grouped_team_board(small, "24h")}
    assert old["Lima"]["samples"] == 180, "the old grouping moved bo's past work to Lima"
    assert (rows["Lima"]["samples"], rows["Dhaka Compute"]["samples"]) == (60, 200)
    assert (rows["Lima"]["members"], rows["Dhaka Compute"]["members"]) == (1, 2), "members are the current ones"
    assert sum(row["samples"] for row in rows.values()) == sum(row["samples"] for row in old.values())
    dumped = {team["name"]: team for team in exports._teams()}
    assert dumped["Lima"]["credit"] == pytest.approx(TeamCredit.objects.get(team=lima).credit), "the daily dump agrees"
    assert dumped["Dhaka Compute"]["members"] == 2

    clock.now = NOW + 2 * datetime.timedelta(days=1)  # the windows age for both teams with no new work
    tasks.credit_rollup_task()
    dhaka_total.refresh_from_db(), lima_total.refresh_from_db()
    assert (dhaka_total.samples_24h, lima_total.samples_24h) == (0, 0)
    assert (dhaka_total.samples_7d, lima_total.samples_7d) == (200, 400 + 60)
    assert TeamCredit.objects.get(team=lima).samples_7d == 400 + 60 + 3


def test_members_who_leave_are_no_longer_counted_but_their_credit_stays(teams, clock):
    small, big, dhaka, lima = teams
    before = RunTeamCredit.objects.get(run=small, team=dhaka)
    assert (before.members, before.members_24h, before.machines) == (3, 3, 4)
    team_leave(user=dhaka.members.get(username="bo"))  # no new work from anyone
    clock.now = NOW + datetime.timedelta(minutes=1)
    assert credit_rollup() == 0
    after = RunTeamCredit.objects.get(run=small, team=dhaka)
    assert (after.members, after.members_24h, after.machines) == (2, 2, 3)
    assert after.credit == pytest.approx(before.credit) and after.samples == before.samples
    assert TeamCredit.objects.get(team=dhaka).members == 2
    [row] = [row for row in leaderboard_rows(run=small, by="team") if row["name"] == "Dhaka Compute"]
    assert (row["members"], row["machines"], row["samples"]) == (2, 3, 500)


def test_verification_and_rejection_reach_the_team(db, clock):
    run, vik = RunFactory(), UserFactory()
    team = team_create(founder=vik, name="Verified")
    session = session_for(run, vik)
    report(session, 1000, confirmed=False)
    credit_rollup()
    cps = rollup.run_credit_per_sample(run)
    SessionEpoch.objects.create(session=session, epoch=1, reported_samples=100, announced_samples=80, status="verified",
                                checked_at=NOW)
    SessionEpoch.objects.create(session=session, epoch=2, reported_samples=30, status="rejected", decided_at=NOW)
    clock.now = NOW + datetime.timedelta(minutes=1)
    credit_rollup()
    total = RunTeamCredit.objects.get(run=run, team=team)
    volunteer = RunCredit.objects.get(run=run, user=vik)
    for field in ("samples_verified", "samples_rejected", "credit_provisional", "credit_verified", "credit"):
        assert getattr(total, field) == pytest.approx(getattr(volunteer, field)), field
    assert (total.samples_verified, total.credit) == (80, pytest.approx(80 * cps))
    assert TeamCredit.objects.get(team=team).credit_verified == pytest.approx(80 * cps)


def test_a_crash_in_the_middle_of_a_batch_counts_nothing_twice_for_teams(db, clock, monkeypatch, settings):
    run, vik = RunFactory(), UserFactory(username="vik")
    team = team_create(founder=vik, name="Crashers")
    session = session_for(run, vik)
    for _ in range(5):
        report(session, 100)
    settings.CREDIT_ROLLUP_BATCH = 2
    real_apply = rollup.run_team_credit_apply
    calls = []

    def crash_on_second_batch(**kwargs):
        calls.append(1)
        if len(calls) == 2:  # the volunteer's totals and both kinds of buckets of the batch are already written
            raise RuntimeError("worker killed")
        real_apply(**kwargs)

    monkeypatch.setattr(rollup, "run_team_credit_apply", crash_on_second_batch)
    with pytest.raises(RuntimeError):
        credit_rollup()
    assert RunTeamCredit.objects.get(run=run, team=team).samples == 200
    assert TeamCredit.objects.get().samples == 200
    assert not TeamCreditHour.objects.exists(), "confirmed work is dated by the epochs pass, after every batch"
    assert RunCredit.objects.get(run=run, user=vik).samples == 200, "the volunteer's totals rolled back with the team's"
    assert RunCreditTotal.objects.get(run=run).samples == 200, "the run's total, written before the crash, rolled back too"
    monkeypatch.setattr(rollup, "run_team_credit_apply", real_apply)
    credit_rollup()
    credit_rollup()
    assert RunTeamCredit.objects.get(run=run, team=team).samples == 500
    assert TeamCreditHour.objects.get().samples == 500 and TeamCredit.objects.get().samples == 500
    assert RunCreditTotal.objects.get(run=run).samples == 500


def test_team_rac_decays_like_a_volunteers(db, clock):
    run, vik = RunFactory(), UserFactory()
    team = team_create(founder=vik, name="Decaying")
    report(session_for(run, vik), 1000)
    credit_rollup()
    before = RunTeamCredit.objects.get(run=run, team=team).recent_average_credit
    assert before == pytest.approx(RunCredit.objects.get(run=run, user=vik).recent_average_credit) and before > 0
    clock.now = NOW + datetime.timedelta(days=7)
    assert leaderboard_rows(run=run, by="team")[0]["recent_average_credit"] == pytest.approx(before / 2), "shown decayed"
    assert tasks.credit_rac_decay_task() == 4  # the volunteer's and the team's run and all-runs rows
    assert RunTeamCredit.objects.get(run=run, team=team).recent_average_credit == pytest.approx(before / 2)
    assert TeamCredit.objects.get(team=team).recent_average_credit == pytest.approx(before / 2)


def test_a_disbanded_team_leaves_the_board(teams):
    small, big, dhaka, lima = teams
    team_disband(team=lima, founder=lima.founder)
    assert "Lima" not in [row["name"] for row in leaderboard_rows(run=small, by="team")]
    assert "Lima" not in [row["name"] for row in leaderboard_rows(run=None, by="team")]


def test_the_migration_backfills_team_totals_from_the_volunteers_totals(teams):
    kept = {(row.run_id, row.team_id): row for row in RunTeamCredit.objects.all()}
    kept_hours = set(TeamCreditHour.objects.values_list("run_id", "team_id", "hour", "samples"))
    kept_teams = {row.team_id: row for row in TeamCredit.objects.all()}
    for model in (RunTeamCredit, TeamCredit, TeamCreditHour):
        model.objects.all().delete()
    migration = __import__("runs.migrations.0007_team_credit", fromlist=["team_credit_backfill"])
    migration.TEAMS_PER_BATCH = 2  # several batches
    migration.team_credit_backfill(apps, None)
    assert set(TeamCreditHour.objects.values_list("run_id", "team_id", "hour", "samples")) == kept_hours
    for rows, kept_rows, key in ((RunTeamCredit.objects.all(), kept, lambda row: (row.run_id, row.team_id)),
                                 (TeamCredit.objects.all(), kept_teams, lambda row: row.team_id)):
        assert {key(row) for row in rows} == set(kept_rows)
        for row in rows:
            for field in [*columns.SUMMED, *rollup.TEAM_COUNTS]:
                assert getattr(row, field) == pytest.approx(getattr(kept_rows[key(row)], field)), field
            assert row.last_seen_at == kept_rows[key(row)].last_seen_at
            assert rollup.rac_now(average=row.recent_average_credit, updated_at=row.rac_updated_at) == pytest.approx(
                rollup.rac_now(average=kept_rows[key(row)].recent_average_credit,
                               updated_at=kept_rows[key(row)].rac_updated_at), rel=0.02)
    assert_same_board(leaderboard_rows(run=None, by="team", window="7d"), grouped_team_board(None, "7d"))
    assert timezone.now() == NOW
