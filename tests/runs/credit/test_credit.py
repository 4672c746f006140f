"""Credit: its unit, the rollup's exactly-once aggregation, windows, RAC and the verified split."""

import datetime

import pytest
from django.utils import timezone

from accounts.services import team_create
from peer_agent.protocol import RunConfig
from runs import tasks
from runs.credit import rollup
from runs.credit.rollup import credit_rollup, rac_update
from runs.credit.verification import epoch_flag
from runs.models import (
    CreditHour,
    CreditRollup,
    RunCredit,
    RunCreditTotal,
    RunTeamCredit,
    SessionEpoch,
    TeamCreditHour,
    TrainingSession,
    VolunteerCredit,
)
from tests.factories import NOW, RunFactory, UserFactory, report, session_for


def test_the_rollup_counts_each_event_once_however_often_it_runs(db, clock):
    run, vik = RunFactory(), UserFactory(username="vik")
    session = session_for(run, vik)
    for samples in (10, 20, 30):
        report(session, samples)
    assert credit_rollup() == 3
    assert credit_rollup() == 0
    total = RunCredit.objects.get(run=run, user=vik)
    cps = rollup.run_credit_per_sample(run)
    assert total.samples == 60 and total.credit == pytest.approx(60 * cps) and total.credit_provisional == 0
    assert total.compute_seconds == pytest.approx(6.0) and total.machines == 1
    assert VolunteerCredit.objects.get(user=vik).credit == pytest.approx(60 * cps)
    report(session, 5)
    credit_rollup()
    assert RunCredit.objects.get(run=run, user=vik).samples == 65
    assert CreditHour.objects.get(run=run, user=vik).samples == 65


def test_a_crash_in_the_middle_of_a_batch_counts_nothing_twice(db, clock, monkeypatch, settings):
    run, vik = RunFactory(), UserFactory(username="vik")
    team = team_create(founder=vik, name="Crashers")
    session = session_for(run, vik)
    for _ in range(5):
        report(session, 100)
    settings.CREDIT_ROLLUP_BATCH = 2
    real_derive = rollup.run_credit_derive
    calls = []

    def crash_on_second_batch(**kwargs):
        calls.append(1)
        if len(calls) == 2:  # the buckets and totals of the batch are already written
            raise RuntimeError("worker killed")
        real_derive(**kwargs)

    monkeypatch.setattr(rollup, "run_credit_derive", crash_on_second_batch)
    with pytest.raises(RuntimeError):
        credit_rollup()
    assert RunCredit.objects.get(run=run, user=vik).samples == 200, "the first batch committed, the second rolled back"
    # Confirmed work is dated into the hourly buckets by the epochs pass, after every batch.
    assert not CreditHour.objects.exists() and not TeamCreditHour.objects.exists()
    assert RunTeamCredit.objects.get(run=run, team=team).samples == 200
    assert RunCreditTotal.objects.get(run=run).samples == 200
    assert CreditRollup.objects.get().event_id == session.events.order_by("seq")[1].pk
    monkeypatch.setattr(rollup, "run_credit_derive", real_derive)
    credit_rollup()
    credit_rollup()
    assert RunCredit.objects.get(run=run, user=vik).samples == 500
    assert CreditHour.objects.get().samples == 500
    assert RunTeamCredit.objects.get(run=run, team=team).samples == 500 and TeamCreditHour.objects.get().samples == 500
    total = RunCreditTotal.objects.get(run=run)
    assert (total.samples, total.samples_24h) == (500, 500)
    assert total.credit == pytest.approx(500 * rollup.run_credit_per_sample(run))


def test_events_still_settling_wait_for_the_next_pass(db, settings):
    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 60
    run, vik = RunFactory(), UserFactory()
    session = session_for(run, vik)
    report(session, 7, at=timezone.now() - datetime.timedelta(minutes=5))
    report(session, 9, at=timezone.now())
    assert credit_rollup() == 1
    assert RunCredit.objects.get(run=run, user=vik).samples == 7


def test_windows_drop_hours_that_age_out_for_idle_volunteers(db, clock):
    run, vik = RunFactory(), UserFactory()
    session = session_for(run, vik)
    report(session, 40, at=NOW - datetime.timedelta(hours=22), epoch=2)  # confirmed when reported
    report(session, 2, at=NOW - datetime.timedelta(days=3), epoch=1)
    credit_rollup()
    total = RunCredit.objects.get(run=run, user=vik)
    assert (total.samples_24h, total.samples_7d, total.samples) == (40, 42, 42)
    clock.now = NOW + datetime.timedelta(hours=3)  # vik sends nothing more
    tasks.credit_rollup_task()
    total.refresh_from_db()
    assert (total.samples_24h, total.samples_7d, total.samples) == (0, 42, 42)
    assert VolunteerCredit.objects.get(user=vik).samples_24h == 0
    clock.now = NOW + datetime.timedelta(days=5)
    tasks.credit_rollup_task()
    total.refresh_from_db()
    assert (total.samples_24h, total.samples_7d, total.samples) == (0, 40, 42)


def test_recent_average_credit_halves_in_a_week_without_work(db, clock):
    average, at = rac_update(average=0.0, updated_at=None, work=0.0, now=NOW)
    for hour in range(1, 24 * 30):  # a month of 100 credit per hour: RAC approaches 2400 per day
        average, at = rac_update(average=average, updated_at=at, work=100.0, now=NOW + datetime.timedelta(hours=hour))
    assert average == pytest.approx(2400 * (1 - 0.5 ** (30 / 7)), rel=0.01)
    later, _ = rac_update(average=average, updated_at=at, work=0.0, now=at + datetime.timedelta(days=7))
    assert later == pytest.approx(average / 2)

    run, vik = RunFactory(), UserFactory()
    report(session_for(run, vik), 1000)
    credit_rollup()
    before = RunCredit.objects.get(run=run, user=vik).recent_average_credit
    assert before > 0
    clock.now = NOW + datetime.timedelta(days=7)
    assert tasks.credit_rac_decay_task() == 2  # the run's row and the all-runs row
    assert RunCredit.objects.get(run=run, user=vik).recent_average_credit == pytest.approx(before / 2)
    assert tasks.credit_rac_decay_task() == 0, "decayed rows are up to date"


def test_verified_and_provisional_credit_follow_the_monitor_and_organizers(db, clock, organizer):
    run, vik = RunFactory(), UserFactory()
    session = session_for(run, vik)
    report(session, 1000, confirmed=False)
    epoch = SessionEpoch.objects.create
    epochs = {
        1: epoch(session=session, epoch=1, reported_samples=100, announced_samples=80, status="verified", checked_at=NOW),
        2: epoch(session=session, epoch=2, reported_samples=50, status="accepted", decided_at=NOW),
        3: epoch(session=session, epoch=3, reported_samples=30, status="rejected", decided_at=NOW),
        4: epoch(session=session, epoch=4, reported_samples=20, announced_samples=5, status="flagged", checked_at=NOW),
    }
    credit_rollup()
    cps = rollup.run_credit_per_sample(run)
    total = RunCredit.objects.get(run=run, user=vik)
    assert (total.samples_verified, total.samples_rejected) == (130, 30)
    assert total.credit_verified == pytest.approx(130 * cps)
    assert total.credit_provisional == pytest.approx((1000 - 130 - 30) * cps)
    assert total.credit == pytest.approx(130 * cps), "boards count only what was confirmed"
    assert total.credit_24h == pytest.approx(130 * cps)

    clock.now = NOW + datetime.timedelta(minutes=5)  # an organizer accepts the flagged epoch, with no new report
    SessionEpoch.objects.filter(pk=epochs[4].pk).update(status="accepted", decided_by=organizer, decided_at=clock.now)
    credit_rollup()
    total.refresh_from_db()
    assert total.samples_verified == 150 and total.credit_provisional == pytest.approx(820 * cps)
    assert (total.credit, total.credit_24h) == pytest.approx((150 * cps, 150 * cps))
    assert VolunteerCredit.objects.get(user=vik).credit == pytest.approx(150 * cps)

    clock.now = NOW + datetime.timedelta(minutes=10)  # and then rejects what it had accepted
    SessionEpoch.objects.filter(pk=epochs[2].pk).update(status="rejected", decided_at=clock.now)
    credit_rollup()
    total.refresh_from_db()
    assert (total.credit, total.credit_24h) == pytest.approx((100 * cps, 100 * cps))
    assert CreditHour.objects.get(run=run, user=vik).samples == 100


def test_credit_taken_back_in_a_later_hour_leaves_the_windows(db, clock):
    run, vik = RunFactory(), UserFactory()
    team = team_create(founder=vik, name="Taken back")
    session = session_for(run, vik)
    report(session, 100, at=NOW - datetime.timedelta(hours=3))  # verified 3 h ago
    report(session, 40, at=NOW - datetime.timedelta(hours=2), epoch=2)  # verified 2 h ago
    credit_rollup()
    clock.now = NOW  # the late reports of epoch 1 disagree with the peer's records: flagged
    epoch_flag(row=SessionEpoch.objects.get(session=session, epoch=1), reported=100, announced=10, detail="too many")
    credit_rollup()
    total, team_total = RunCredit.objects.get(run=run, user=vik), RunTeamCredit.objects.get(run=run, team=team)
    assert (total.samples_verified, total.samples_24h, total.samples_7d) == (40, 40, 40)
    assert total.credit_24h == pytest.approx(total.credit)
    assert (team_total.samples_24h, team_total.samples_7d) == (40, 40)
    assert sorted(CreditHour.objects.values_list("samples", flat=True)) == [0, 0, 40], "the latest credit went first"
    assert RunCreditTotal.objects.get(run=run).samples_24h == 40


def test_credit_adds_up_across_runs_of_different_sizes(db, clock):
    small = RunFactory()
    big = RunFactory(config=RunConfig.model_validate({"model": {"preset": "base"}}).model_dump(mode="json"))
    vik = UserFactory()
    report(session_for(small, vik), 100)
    report(session_for(big, vik, machine="desktop"), 100)
    credit_rollup()
    everywhere = VolunteerCredit.objects.get(user=vik)
    assert everywhere.samples == 200 and everywhere.machines == 2
    assert everywhere.credit == pytest.approx(100 * (rollup.run_credit_per_sample(small) + rollup.run_credit_per_sample(big)))
    assert rollup.run_credit_per_sample(big) > 10 * rollup.run_credit_per_sample(small)


def test_silent_sessions_are_closed_when_last_seen(db, settings):
    run, vik = RunFactory(), UserFactory()
    silent, talking = session_for(run, vik), session_for(run, vik, machine="desktop")
    long_ago = timezone.now() - datetime.timedelta(seconds=settings.SESSION_SILENT_CLOSE_SECONDS + 60)
    TrainingSession.objects.filter(pk=silent.pk).update(last_seen_at=long_ago)
    assert tasks.sessions_close_silent_task() == 1
    assert tasks.sessions_close_silent_task() == 0
    silent.refresh_from_db(), talking.refresh_from_db()
    assert silent.ended_at == long_ago and talking.ended_at is None


def test_an_aggregator_that_reports_nothing_stays_open_while_its_access_lasts(db, settings):
    """An aggregator's refreshes are its only word, further apart than the silence that closes a trainer."""
    run, olga = RunFactory(), UserFactory()
    aggregator = session_for(run, olga)
    long_ago = timezone.now() - datetime.timedelta(seconds=settings.SESSION_SILENT_CLOSE_SECONDS + 60)
    TrainingSession.objects.filter(pk=aggregator.pk).update(
        role=TrainingSession.Role.AGGREGATOR, last_seen_at=long_ago,
        access_expires_at=timezone.now() + datetime.timedelta(minutes=10))
    assert tasks.sessions_close_silent_task() == 0
    TrainingSession.objects.filter(pk=aggregator.pk).update(access_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert tasks.sessions_close_silent_task() == 1, "its access ran out unrefreshed: it is gone"
    aggregator.refresh_from_db()
    assert aggregator.ended_at == long_ago

