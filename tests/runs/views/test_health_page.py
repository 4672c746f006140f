"""The run health page: full for the run's organizers, without moderation details for everyone else
who may see the run."""

import datetime

import pytest
from django.utils import timezone

from runs.models import Backbone, Checkpoint, Run, RunEvent, RunSample, SessionEpoch, TrainingSession
from runs.setup.services import run_ban
from runs.swarm.health import epochs_per_hour
from tests.factories import RunFactory, UserFactory


@pytest.fixture
def run(organizer, volunteer):
    run = RunFactory(slug="the-run", organizers=[organizer], coordinator_peer_id="QmCoordinator",
                     coordinator_heartbeat_at=timezone.now())
    now = timezone.now()
    RunSample.objects.bulk_create(
        RunSample(run=run, at=now - datetime.timedelta(minutes=30 - i), global_epoch=10 + i // 10,
                  samples_per_second=40.0 + i, alive_peers=3, client_peers=1, loss=4.0 - i / 100)
        for i in range(31)
    )
    session = TrainingSession.objects.create(run=run, user=volunteer, peer_public_key="key", agent_version="0.1.0",
                                             access_expires_at=now, started_at=now - datetime.timedelta(minutes=20),
                                             ended_at=now - datetime.timedelta(minutes=5))
    SessionEpoch.objects.create(session=session, epoch=11, reported_samples=640, announced_samples=64, status="flagged",
                                detail="reported 640, announced 64")
    Checkpoint.objects.create(run=run, epoch=12, file="checkpoints/x.zip", created_at=now - datetime.timedelta(minutes=10))
    run_ban(run=run, actor=organizer, user=UserFactory(username="mallory"), reason="fake samples")
    RunEvent.objects.create(run=run, kind=RunEvent.Kind.PAUSED, at=now - datetime.timedelta(minutes=8))
    return run


def page(client):
    return client.get("/runs/the-run/health/")


def test_organizers_see_the_swarm_the_pace_flags_and_bans(client_for, run, organizer):
    html = page(client_for(organizer)).content.decode()
    assert '<span class="stat" id="health-peers">3</span>' in html
    assert '<span class="stat" id="health-rate">70.0</span>' in html
    assert '<span class="stat" id="health-epoch">13</span>' in html
    assert '<span id="health-epoch-rate">6.0</span> epochs/hour' in html  # 3 epochs in 30 minutes
    assert '<strong id="health-flagged-epochs">1</strong> (in 1 session)' in html
    assert "QmCoordinator" in html and "coordinator-warning" not in html
    for label in ("a peer joined", "a peer left", "checkpoint of epoch 12", "Paused", "Banned mallory: fake samples"):
        assert label in html


def test_everyone_else_sees_the_figures_without_moderation_details(client_for, run, volunteer):
    for who in (None, volunteer):
        html = page(client_for(who)).content.decode()
        assert '<span class="stat" id="health-peers">3</span>' in html
        assert "checkpoint of epoch 12" in html and "a peer joined" in html
        assert "health-flagged" not in html
        assert "mallory" not in html and "fake samples" not in html and '"banned"' not in html


def test_a_stale_heartbeat_is_a_warning(client_for, run):
    Run.objects.filter(pk=run.pk).update(coordinator_heartbeat_at=timezone.now() - datetime.timedelta(minutes=3))
    html = page(client_for(None)).content.decode()
    assert "The coordinator's last heartbeat was 3\xa0minutes ago" in html
    Run.objects.filter(pk=run.pk).update(coordinator_heartbeat_at=None)
    assert "No coordinator has reported for this run" in page(client_for(None)).content.decode()


def test_organizers_get_a_link_to_the_flags_view(client_for, run, organizer):
    assert '<a href="/runs/the-run/flags/">review flagged epochs</a>' in page(client_for(organizer)).content.decode()


@pytest.mark.parametrize("visibility", [Run.Visibility.INVITE, Run.Visibility.ALLOWLIST])
def test_an_invite_only_runs_health_is_as_visible_as_its_page(client_for, run, outsider, visibility):
    Run.objects.filter(pk=run.pk).update(visibility=visibility)
    for who in (None, outsider):
        html = page(client_for(who)).content.decode()
        assert "review flagged epochs" not in html, "moderation details are for organizers"


def test_a_draft_runs_health_is_for_its_organizers(client_for, organizer, outsider):
    RunFactory(slug="the-run", organizers=[organizer], status=Run.Status.DRAFT)
    assert page(client_for(outsider)).status_code == 404
    assert page(client_for(organizer)).status_code == 200


def test_the_epoch_rate_needs_a_minute_of_readings(run):
    latest = run.samples.order_by("-at").first()
    assert epochs_per_hour(run=run, until=latest.at) == pytest.approx(6.0)
    assert epochs_per_hour(run=run, until=latest.at - datetime.timedelta(minutes=29, seconds=30)) is None


def test_each_backbone_peer_shows_its_state_and_only_organizers_see_where_it_runs(client_for, run, organizer, outsider):
    now = timezone.now()
    Backbone.objects.create(run=run, peer_id="QmFirstBackbone", host="backbone-a.example", maddrs=["/ip4/10.0.0.1/tcp/31337"],
                            started_at=now - datetime.timedelta(hours=2), heartbeat_at=now - datetime.timedelta(minutes=10))
    Backbone.objects.create(run=run, peer_id="QmSecondBackbone", host="backbone-b.example", maddrs=["/ip4/10.0.0.2/tcp/31337"],
                            started_at=now - datetime.timedelta(hours=1), heartbeat_at=now)
    Run.objects.filter(pk=run.pk).update(coordinator_peer_id="QmSecondBackbone", duties_until=now + datetime.timedelta(minutes=3))

    html = page(client_for(organizer)).content.decode()
    html = html[html.index('<table id="backbones">'):]
    first, second = html.index("QmFirstBackbone"), html.index("QmSecondBackbone")
    assert first < second, "the oldest backbone peer comes first"
    assert "silent" in html[first:second] and "holds the duties" not in html[first:second]
    assert "live, holds the duties" in html[second:]
    assert "backbone-b.example" in html and "/ip4/10.0.0.2/tcp/31337" in html

    for who in (None, outsider):
        html = page(client_for(who)).content.decode()
        assert "QmSecondBackbone" in html and "live, holds the duties" in html
        assert "backbone-b.example" not in html and "/ip4/10.0.0" not in html, "where backbone peers run is for organizers"

    Run.objects.filter(pk=run.pk).update(duties_until=now - datetime.timedelta(seconds=1))
    assert "holds the duties" not in page(client_for(organizer)).content.decode(), "a lapsed hold is no one's"


def test_each_backbone_peer_shows_whether_it_aggregates_and_how_many_rounds_it_joined(client_for, run, outsider):
    Backbone.objects.create(run=run, peer_id="QmAggregating", host="a.example", aggregates=True, aggregator_rounds=1234)
    Backbone.objects.create(run=run, peer_id="QmPlain", host="b.example", aggregates=False, aggregator_rounds=7)

    html = page(client_for(outsider)).content.decode()
    html = html[html.index('<table id="backbones">'):html.index("</table>")]
    aggregating, plain = html.index("QmAggregating"), html.index("QmPlain")
    assert "1,234" in html[aggregating:plain] and "does not aggregate" not in html[aggregating:plain]
    assert "does not aggregate" in html[plain:] and ">7<" not in html[plain:], "rounds of a stopped aggregator are not shown"
