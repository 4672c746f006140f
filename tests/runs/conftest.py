"""Fixtures shared by the tests of runs/."""

import datetime

import pytest
from django.utils import timezone

from accounts.services import team_create, team_join, token_create
from peer_agent.protocol import RunConfig
from runs.credit.rollup import credit_rollup
from runs.models import TrainingSession
from tests.factories import NOW, RunFactory, UserFactory, report, session_for

HOUR = datetime.timedelta(hours=1)


@pytest.fixture
def clock(monkeypatch):
    """`clock.now` is what timezone.now() returns, from NOW on; move it with `clock.now += ...`."""

    class Clock:
        now = NOW

    monkeypatch.setattr(timezone, "now", lambda: Clock.now)
    return Clock


@pytest.fixture
def team_changes_on_the_clock(clock, monkeypatch):
    """Joins and leaves (TeamEvent.at) are dated by the clock too: the field's default was bound to
    the real timezone.now before the clock replaced it. The credit recount reads who was in which
    team when (runs/credit/recount.py)."""
    from accounts.models import TeamEvent

    monkeypatch.setattr(TeamEvent._meta.get_field("at"), "_get_default", lambda: timezone.now())
    return clock


@pytest.fixture(autouse=True)
def _rollup_takes_every_event(settings):
    """The rollup takes events as soon as they are stored (tests of the settle delay set their own)."""
    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 0


@pytest.fixture
def session(volunteer):
    """A volunteer's session in an active tiny run, with its agent token's secret as ``.secret``
    (what the tests of `WS /ws/agent/` report with)."""
    run = RunFactory()
    token, secret = token_create(user=volunteer, name="laptop")
    session = TrainingSession.objects.create(
        run=run, user=volunteer, token=token, peer_public_key="ssh-rsa AAAA", agent_version="0.1.0",
        access_expires_at=datetime.datetime.now(datetime.UTC),
    )
    session.secret = secret
    return session


@pytest.fixture
def teams(db, clock):
    """Two runs of different sizes; three teams (one with a hidden and an anonymous member), a
    volunteer with no team; work 2 h, 2 days and 10 days ago, rolled up as it arrives."""
    small = RunFactory(slug="small")
    big = RunFactory(slug="big", config=RunConfig.model_validate({"model": {"preset": "base"}}).model_dump(mode="json"))
    amina, bo = UserFactory(username="amina"), UserFactory(username="bo")
    ghost = UserFactory(username="ghost", visibility="hidden")
    shy, carla, loner = UserFactory(username="shy", visibility="anonymous"), UserFactory(username="carla"), UserFactory()
    dhaka = team_create(founder=amina, name="Dhaka Compute")
    for member in (bo, ghost):
        team_join(user=member, team=dhaka)
    lima = team_create(founder=shy, name="Lima")
    team_create(founder=carla, name="Solo")
    work = [
        (small, amina, 300, 10 * 24), (small, bo, 120, 2), (small, ghost, 50, 2), (small, shy, 400, 48),
        (small, carla, 90, 2), (small, loner, 1000, 2), (big, amina, 7, 2), (big, shy, 3, 48), (big, carla, 5, 10 * 24),
    ]
    for hours_ago in sorted({hours for *_, hours in work}, reverse=True):
        clock.now = NOW - hours_ago * HOUR
        for run, user, samples, when in work:
            if when == hours_ago:
                report(session_for(run, user, machine=f"{user.username}-{run.slug}"), samples, at=clock.now)
        credit_rollup()
    report(session_for(small, amina, machine="amina-second"), 30, at=NOW - HOUR)
    clock.now = NOW
    credit_rollup()
    return small, big, dhaka, lima
