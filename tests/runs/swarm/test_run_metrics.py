"""What /metrics says about agents' reports and each active run, checked against known activity."""

import datetime
import json
import math

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from portal.asgi import application
from runs.credit.rollup import credit_rollup
from runs.models import Run, RunCreditTotal, RunSample, SessionEpoch, StepCommitment, TrainingSession
from tests.agent_wire import exchange, report
from tests.factories import RunFactory, UserFactory, session_for
from tests.factories import report as stored_report
from tests.scrape import scrape

pytestmark = pytest.mark.django_db(transaction=True)


def test_n_reports_add_n_to_the_accepted_counter_and_each_ack_is_timed(session, settings):
    before = scrape(settings)
    answers = exchange(session.secret, [report(session.pk, 1), report(session.pk, 2), report(session.pk, 3),
                                        report(session.pk, 2)])  # resent: acknowledged again, stored once
    assert [answer["type"] for answer in answers] == ["ack"] * 4
    after = scrape(settings)
    assert after.increase(before, "dedloc_reports_accepted_total") == 3
    assert after.increase(before, "dedloc_ingest_ack_seconds_count") == 4
    assert after.total("dedloc_reports_refused_total") == before.total("dedloc_reports_refused_total")


def test_a_refused_frame_counts_under_its_code(session, settings):
    before = scrape(settings)
    answers = exchange(session.secret, ["not json", json.dumps(report(session.pk, 1, samples=-5)), report(session.pk, 2)])
    assert [answer.get("code") for answer in answers] == ["bad_json", "invalid_report", None]
    after = scrape(settings)
    assert after.increase(before, "dedloc_reports_refused_total", code="bad_json") == 1
    assert after.increase(before, "dedloc_reports_refused_total", code="invalid_report") == 1
    assert after.increase(before, "dedloc_reports_accepted_total") == 1
    Run.objects.filter(pk=session.run_id).update(status=Run.Status.FINISHED)
    exchange(session.secret, [report(session.pk, 3)])
    assert scrape(settings).increase(after, "dedloc_reports_refused_total", code="run_finished") == 1


def test_open_agent_sockets_are_counted_while_open(session, settings):
    async def while_connected():
        communicator = WebsocketCommunicator(application, "/ws/agent/",
                                             headers=[(b"authorization", f"Bearer {session.secret}".encode())])
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_to(text_data=json.dumps(report(session.pk, 1)))  # answered once the socket is counted
        assert json.loads(await communicator.receive_from(timeout=10))["type"] == "ack"
        during = await sync_to_async(scrape)(settings)
        await communicator.disconnect()
        return during

    before = scrape(settings)
    during = async_to_sync(while_connected)()
    assert during.increase(before, "dedloc_agent_sockets_open") == 1
    assert scrape(settings).value("dedloc_agent_sockets_open") == before.value("dedloc_agent_sockets_open")


def test_open_viewer_sockets_are_counted_while_open(session, settings):
    async def while_watching():
        communicator = WebsocketCommunicator(application, f"/ws/runs/{session.run.slug}/live/",
                                             headers=[(b"origin", b"http://127.0.0.1")])
        assert (await communicator.connect(timeout=10))[0]
        await communicator.receive_from(timeout=10)  # the first snapshot: the viewer is counted by now
        during = await sync_to_async(scrape)(settings)
        await communicator.disconnect()
        return during

    before = scrape(settings)
    during = async_to_sync(while_watching)()
    assert during.increase(before, "dedloc_viewer_sockets_open") == 1
    assert scrape(settings).value("dedloc_viewer_sockets_open") == before.value("dedloc_viewer_sockets_open")


def test_each_active_run_shows_its_swarm_heartbeat_and_credit_awaiting_confirmation(session, settings):
    run = session.run
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(coordinator_heartbeat_at=now - datetime.timedelta(seconds=40))
    RunSample.objects.create(run=run, at=now - datetime.timedelta(minutes=2), global_epoch=6, samples_per_second=10,
                             alive_peers=5, loss=3.0)
    RunSample.objects.create(run=run, at=now, global_epoch=7, samples_per_second=40.5, alive_peers=3, loss=2.25)
    SessionEpoch.objects.create(session=session, epoch=4, reported_samples=640, status=SessionEpoch.Status.FLAGGED)
    SessionEpoch.objects.create(session=session, epoch=5, reported_samples=640, status=SessionEpoch.Status.FLAGGED)
    caught = session_for(run, UserFactory(username="caught"))
    TrainingSession.objects.filter(pk=caught.pk).update(suspended_at=now, suspension_reason="2 spot checks failed")
    for epoch, (owner, outcome) in enumerate([(session, "pending"), (session, "passed"), (caught, "failed"),
                                              (caught, "failed"), (caught, "pending"), (session, "pending")]):
        StepCommitment.objects.create(session=owner, epoch=epoch, micro_batch_size=8, shuffle_buffer=64,
                                      steps=[[0, 8, "AAAA"]], samples=8, outcome=outcome)
    # Queued for a validator worker: the oldest waited five minutes.
    StepCommitment.objects.filter(session__run=run, epoch=4).update(queued_at=now - datetime.timedelta(minutes=5))
    StepCommitment.objects.filter(session__run=run, epoch=5).update(queued_at=now)
    StepCommitment.objects.filter(session__run=run, epoch=1).update(queued_at=now - datetime.timedelta(hours=1))  # recorded
    RunCreditTotal.objects.update_or_create(run=run, defaults={"credit_provisional": 12.5})
    silent = RunFactory(slug="never-coordinated", coordinator_heartbeat_at=None)
    RunFactory(slug="paused-run", status=Run.Status.PAUSED)

    scraped = scrape(settings)
    assert scraped.value("dedloc_run_alive_peers", run=run.slug) == 3  # the latest reading
    assert scraped.value("dedloc_run_samples_per_second", run=run.slug) == 40.5
    assert scraped.value("dedloc_run_global_epoch", run=run.slug) == 7
    assert scraped.value("dedloc_run_loss", run=run.slug) == 2.25
    assert 40 <= scraped.value("dedloc_run_coordinator_heartbeat_age_seconds", run=run.slug) < 40 + 300
    assert scraped.value("dedloc_run_flagged_epochs", run=run.slug) == 2
    assert scraped.value("dedloc_run_spot_checks_pending", run=run.slug) == 3
    assert scraped.value("dedloc_run_spot_checks_failed", run=run.slug) == 2
    assert scraped.value("dedloc_run_spot_checks_queued", run=run.slug) == 2
    assert 300 <= scraped.value("dedloc_run_spot_check_queue_age_seconds", run=run.slug) < 300 + 300
    assert scraped.value("dedloc_run_spot_check_queue_age_seconds", run=silent.slug) == 0
    assert scraped.value("dedloc_run_suspended_sessions", run=run.slug) == 1
    assert scraped.value("dedloc_run_suspended_sessions", run=silent.slug) == 0
    assert scraped.value("dedloc_run_pending_credit", run=run.slug) == 12.5
    # A run the monitor never read: no peer seen alive, a heartbeat never given, no made-up figures.
    assert scraped.has("dedloc_run_alive_peers", run=silent.slug)
    assert scraped.value("dedloc_run_alive_peers", run=silent.slug) == 0
    assert math.isinf(scraped.value("dedloc_run_coordinator_heartbeat_age_seconds", run=silent.slug))
    assert not scraped.has("dedloc_run_loss", run=silent.slug)
    assert not any(dict(labels).get("run") == "paused-run" for _, labels in scraped.samples)


def test_the_rollup_lag_is_the_age_of_the_oldest_event_not_rolled_up_and_batches_are_timed(session, settings):
    waiting_since = timezone.now() - datetime.timedelta(minutes=5)
    stored_report(session, 32, at=waiting_since, confirmed=False)
    stored_report(session, 32, at=timezone.now(), confirmed=False)
    before = scrape(settings)
    assert 300 <= before.value("dedloc_credit_rollup_lag_seconds") < 300 + 300
    credit_rollup()
    after = scrape(settings)
    assert after.value("dedloc_credit_rollup_lag_seconds") == 0
    assert after.increase(before, "dedloc_credit_rollup_batch_seconds_count") >= 1
