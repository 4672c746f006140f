"""Milestone badges follow confirmed work only: the rollup awards them once, flagged or rejected work
earns none, and work taken back takes its badges back (runs/credit/milestones.py, docs/volunteers.md)."""

import math

import pytest

from accounts.services import team_create, team_join
from runs.credit.milestones import TEAM_THRESHOLDS, VOLUNTEER_THRESHOLDS, milestones_held, milestones_refresh_all
from runs.credit.rollup import credit_rollup, run_credit_per_sample
from runs.credit.verification import epoch_flag, flag_reject
from runs.models import Milestone, RunCredit, SessionEpoch
from tests.factories import RunFactory, UserFactory, report, session_for

pytestmark = pytest.mark.django_db

SAMPLES, CREDIT = Milestone.Measure.SAMPLES, Milestone.Measure.CREDIT
FIRST = VOLUNTEER_THRESHOLDS[SAMPLES][0]


def held(user, run=None) -> set[tuple[str, int]]:
    return set(Milestone.objects.filter(user=user, run=run, revoked_at=None).values_list("measure", "threshold"))


def expected(samples: int, cps: float, thresholds=VOLUNTEER_THRESHOLDS) -> set[tuple[str, int]]:
    return ({(SAMPLES, t) for t in thresholds[SAMPLES] if samples >= t}
            | {(CREDIT, t) for t in thresholds[CREDIT] if samples * cps >= t})


def test_confirmed_samples_past_a_threshold_earn_the_badges_once_in_the_run_and_across_runs(clock, volunteer):
    run = RunFactory()
    session = session_for(run, volunteer)
    report(session, FIRST - 1)
    credit_rollup()
    assert (SAMPLES, FIRST) not in held(volunteer, run)
    report(session, 1)
    credit_rollup()
    credit_rollup()
    cps = run_credit_per_sample(run)
    assert held(volunteer, run) == held(volunteer) == expected(FIRST, cps)
    assert (SAMPLES, FIRST) in held(volunteer)
    assert Milestone.objects.filter(user=volunteer).count() == 2 * len(expected(FIRST, cps))
    assert milestones_refresh_all() == 0  # the hourly pass finds them all in place


def test_a_cheater_s_reported_and_flagged_samples_earn_no_badge(clock, volunteer):
    run = RunFactory()
    session = session_for(run, volunteer)
    many = VOLUNTEER_THRESHOLDS[SAMPLES][-1]  # claims past every threshold
    report(session, many, confirmed=False)
    credit_rollup()
    assert RunCredit.objects.get(user=volunteer).samples == many
    assert not Milestone.objects.exists()
    row = SessionEpoch.objects.create(session=session, epoch=1, reported_samples=many)
    epoch_flag(row=row, reported=many, announced=FIRST, detail="the DHT record announced far fewer samples")
    credit_rollup()
    assert RunCredit.objects.get(user=volunteer).credit_provisional > 0
    assert not Milestone.objects.exists()
    flag_reject(row=row, by=UserFactory(organizer=True))
    credit_rollup()
    assert milestones_refresh_all() == 0
    assert not Milestone.objects.exists()


def test_work_flagged_then_rejected_takes_its_badges_back_and_earning_them_again_restores_them(clock, volunteer):
    run = RunFactory()
    session = session_for(run, volunteer)
    report(session, FIRST, epoch=1)
    credit_rollup()
    first = Milestone.objects.get(user=volunteer, run=run, measure=SAMPLES, threshold=FIRST)
    # New figures for the epoch disagree with its record: the monitor flags it, its credit is pending again.
    row = SessionEpoch.objects.get(session=session, epoch=1)
    clock.now += clock.now.resolution * 10**6
    epoch_flag(row=row, reported=2 * FIRST, announced=FIRST, detail="reported twice what was announced")
    credit_rollup()
    first.refresh_from_db()
    assert first.revoked_at is not None and (SAMPLES, FIRST) not in held(volunteer)
    flag_reject(row=row, by=UserFactory(organizer=True))
    credit_rollup()
    assert held(volunteer, run) == set() and held(volunteer) == set()
    assert milestones_held(run_id=run.pk, holder="user", ids=[volunteer.pk]) == {}
    # Honest work afterwards earns the badge again: the same row, its first date kept.
    report(session, FIRST, epoch=2)
    credit_rollup()
    again = Milestone.objects.get(user=volunteer, run=run, measure=SAMPLES, threshold=FIRST)
    assert again.pk == first.pk and again.revoked_at is None and again.reached_at == first.reached_at


def test_a_team_reaches_its_milestones_with_its_members_confirmed_work(clock):
    run = RunFactory()
    team_threshold = TEAM_THRESHOLDS[SAMPLES][0]
    founder, member = UserFactory(), UserFactory()
    team = team_create(founder=founder, name="Dhaka Compute")
    team_join(user=member, team=team)
    each = math.ceil(team_threshold / 2)
    for user in (founder, member):
        report(session_for(run, user), each)
    credit_rollup()
    team_badges = set(Milestone.objects.filter(team=team, run=run, revoked_at=None).values_list("measure", "threshold"))
    assert team_badges == expected(2 * each, run_credit_per_sample(run), TEAM_THRESHOLDS)
    assert (SAMPLES, team_threshold) in team_badges
    assert (SAMPLES, team_threshold) not in held(founder, run)  # a team's thresholds are its own
    assert milestones_held(run_id=None, holder="team", ids=[team.pk])[team.pk][0] == {
        "measure": "samples", "threshold": max(t for measure, t in team_badges if measure == SAMPLES)}


def test_a_badge_exists_once_per_holder_scope_and_threshold(clock, volunteer):
    from django.db import IntegrityError, transaction

    Milestone.objects.create(user=volunteer, run=None, measure=SAMPLES, threshold=FIRST)
    with pytest.raises(IntegrityError), transaction.atomic():
        Milestone.objects.create(user=volunteer, run=None, measure=SAMPLES, threshold=FIRST)


def test_a_profile_shows_the_highest_badge_of_each_measure_and_none_of_a_run_the_viewer_may_not_see(client, clock, outsider):
    from runs.models import Run

    amina = UserFactory(username="amina")
    open_run, closed_run = RunFactory(name="Open run"), RunFactory(name="Members run")
    report(session_for(open_run, amina), VOLUNTEER_THRESHOLDS[SAMPLES][1])
    report(session_for(closed_run, amina), FIRST)
    credit_rollup()
    Run.objects.filter(pk=closed_run.pk).update(audience=Run.Audience.MEMBERS, visibility=Run.Visibility.ALLOWLIST)
    closed_run.allowlist.add(amina)
    client.force_login(outsider)
    shown = client.get("/volunteers/amina/").context["milestones"]
    scopes = [(badge.run_id, badge.measure, badge.threshold) for badge in shown]
    assert (None, SAMPLES, VOLUNTEER_THRESHOLDS[SAMPLES][1]) in scopes
    assert (open_run.pk, SAMPLES, VOLUNTEER_THRESHOLDS[SAMPLES][1]) in scopes
    assert len(scopes) == len({scope[:2] for scope in scopes}), "one badge per scope and measure: the highest"
    assert all(run_id != closed_run.pk for run_id, _, _ in scopes)
    assert "Members run" not in client.get("/volunteers/amina/").content.decode()
    client.force_login(amina)
    assert any(badge.run_id == closed_run.pk for badge in client.get("/volunteers/amina/").context["milestones"])


def test_a_milestone_reached_is_announced_once_to_the_volunteer_and_to_each_member_of_a_team(clock, volunteer):
    from django.utils import translation

    from accounts.models import Notification
    from accounts.notifications import notification_text

    run = RunFactory(name="Bangla ALBERT")
    team = team_create(founder=volunteer, name="Dhaka Compute")
    member = UserFactory()
    team_join(user=member, team=team)
    session = session_for(run, volunteer)
    report(session, TEAM_THRESHOLDS[SAMPLES][0], epoch=1)
    credit_rollup()
    credit_rollup()
    badge = Milestone.objects.get(user=volunteer, run=run, measure=SAMPLES, threshold=FIRST)
    mine = Notification.objects.filter(user=volunteer, kind="milestone")
    assert mine.filter(key=f"badge:{badge.pk}").count() == 1
    assert mine.count() == Milestone.objects.filter(user=volunteer).count() + Milestone.objects.filter(team=team).count()
    team_badge = Milestone.objects.get(team=team, run=run, measure=SAMPLES, threshold=TEAM_THRESHOLDS[SAMPLES][0])
    assert Notification.objects.filter(user=member, key=f"team-badge:{team_badge.pk}").count() == 1
    assert not Notification.objects.filter(user=member, key__startswith="badge:").exists()  # the member trained nothing
    notice = mine.get(key=f"badge:{badge.pk}")
    assert notification_text(notice) == f"You reached a milestone: {FIRST:,} confirmed samples in run “Bangla ALBERT”."
    with translation.override("bn"):
        assert "“Bangla ALBERT” রানে" in notification_text(notice) and "নিশ্চিত নমুনা" in notification_text(notice)
    # Taken back and earned again: the same badge, not announced a second time.
    row = SessionEpoch.objects.get(session=session, epoch=1)
    clock.now += clock.now.resolution * 10**6
    epoch_flag(row=row, reported=2 * FIRST, announced=1, detail="a mismatch")
    credit_rollup()
    assert Milestone.objects.get(pk=badge.pk).revoked_at is not None
    report(session, FIRST, epoch=2)
    credit_rollup()
    assert Milestone.objects.get(pk=badge.pk).revoked_at is None
    assert mine.filter(key=f"badge:{badge.pk}").count() == 1


def test_the_hourly_check_awards_what_totals_hold_without_a_flood_of_notices(clock, volunteer):
    from accounts.models import Notification
    from runs.models import VolunteerCredit

    # Totals from before badges existed (or rewritten by a rebuild): the check awards their badges.
    VolunteerCredit.objects.create(user=volunteer, samples=FIRST, samples_verified=FIRST, credit=0.0)
    assert milestones_refresh_all() == 1
    assert held(volunteer) == {(SAMPLES, FIRST)}
    assert not Notification.objects.exists()
    VolunteerCredit.objects.filter(user=volunteer).update(samples_verified=FIRST - 1)
    assert milestones_refresh_all() == 0
    assert held(volunteer) == set()
