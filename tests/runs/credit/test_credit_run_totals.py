"""Run totals the rollup keeps (RunCreditTotal): the boards' share column divides by them instead
of summing the run's volunteer totals on every request, and they always equal that sum."""

import datetime

import pytest
from django.apps import apps
from django.db.models import Sum

from runs import tasks
from runs.credit.boards import WINDOWS, board_credit, leaderboard_rows
from runs.credit.rollup import credit_rollup
from runs.models import RunCredit, RunCreditTotal, SessionEpoch, VolunteerCredit
from tests.factories import NOW


def summed_board_credit(run, window: str) -> float:
    """The share's denominator as the boards computed it before run totals existed."""
    samples_column, credit_column = WINDOWS[window]
    totals = (RunCredit.objects.filter(run=run) if run else VolunteerCredit.objects.all()).filter(**{f"{samples_column}__gt": 0})
    return totals.aggregate(credit=Sum(credit_column))["credit"] or 0.0


def assert_shares_as_summed(small, big) -> None:
    for run in (small, big, None):
        for window in WINDOWS:
            summed = summed_board_credit(run, window)
            assert board_credit(run=run, window=window) == pytest.approx(summed, abs=1e-9), (run, window)
            for by in ("user", "team"):
                for row in leaderboard_rows(run=run, by=by, window=window):
                    assert row["share"] == pytest.approx(row["credit"] / summed), (run, window, by, row["name"])


def assert_totals_are_the_volunteers_sums() -> None:
    for total in RunCreditTotal.objects.all():
        summed = RunCredit.objects.filter(run_id=total.run_id).aggregate(
            **{field: Sum(field) for field in ("samples", "samples_verified", "samples_rejected", "credit_provisional",
                                               "credit_verified", "credit", "samples_24h", "credit_24h", "samples_7d",
                                               "credit_7d")})
        for field, value in summed.items():
            assert getattr(total, field) == pytest.approx(value or 0, abs=1e-9), (total.run_id, field)


def test_shares_equal_the_summed_ones_in_every_window(teams):
    small, big, *_ = teams
    assert {window: board_credit(run=small, window=window) > 0 for window in WINDOWS} == dict.fromkeys(WINDOWS, True)
    assert board_credit(run=small, window="24h") < board_credit(run=small, window="7d") < board_credit(run=small)
    assert_shares_as_summed(small, big)
    assert_totals_are_the_volunteers_sums()


def test_shares_follow_a_verification_and_a_rejection(teams, clock):
    small, big, *_ = teams
    before = RunCreditTotal.objects.get(run=small)
    session = small.sessions.filter(user__username="amina").order_by("pk").first()  # 300 samples of epoch 1, confirmed
    SessionEpoch.objects.filter(session=session, epoch=1).update(announced_samples=80, checked_at=NOW)  # re-judged
    SessionEpoch.objects.create(session=session, epoch=2, reported_samples=50, status="rejected", decided_at=NOW)
    clock.now = NOW + datetime.timedelta(minutes=1)
    credit_rollup()
    total = RunCreditTotal.objects.get(run=small)
    assert (total.samples_verified, total.samples_rejected) == (before.samples_verified - 300 + 80, 50)
    assert total.credit < before.credit, "work the peer's records do not back leaves the run's total"
    assert_shares_as_summed(small, big)
    assert_totals_are_the_volunteers_sums()


@pytest.mark.parametrize("later", [datetime.timedelta(hours=25), datetime.timedelta(days=3), datetime.timedelta(days=8)])
def test_shares_follow_the_windows_as_they_age(teams, clock, later):
    small, big, *_ = teams
    clock.now = NOW + later  # nobody sends anything more; the fixture's last work was 1 and 2 h before NOW
    tasks.credit_rollup_task()
    total = RunCreditTotal.objects.get(run=small)
    assert (total.samples_24h, total.credit_24h) == (0, 0.0), "no rounding left behind"
    assert (total.samples_7d == 0) == (later > datetime.timedelta(days=7))
    assert_shares_as_summed(small, big)
    assert_totals_are_the_volunteers_sums()


def test_the_migration_backfills_run_totals_from_the_volunteers_totals(teams):
    small, big, *_ = teams
    kept = {row.run_id: row for row in RunCreditTotal.objects.all()}
    assert set(kept) == {small.pk, big.pk}
    RunCreditTotal.objects.all().delete()
    migration = __import__("runs.migrations.0008_run_credit_total", fromlist=["run_credit_total_backfill"])
    migration.run_credit_total_backfill(apps, None)
    rows = {row.run_id: row for row in RunCreditTotal.objects.all()}
    assert set(rows) == set(kept)
    for run_id, row in rows.items():
        for field in migration.SUMMED:
            assert getattr(row, field) == pytest.approx(getattr(kept[run_id], field)), field
    assert_shares_as_summed(small, big)
