"""The plausibility rules of `WS /ws/agent/` (runs.ingest.reports.RULES): each refuses what no honest agent
sends, with an error frame naming it, a ReportRejection for the organizer and no credit."""

import datetime
import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from peer_agent.protocol import Report
from portal.asgi import application
from runs.ingest import reports
from runs.models import ContributionEvent, ReportRejection, TrainingSession
from tests.agent_wire import exchange, report, total

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)


def pace(**changes) -> reports.SessionPace:
    fields = dict(started_at=NOW - datetime.timedelta(hours=1), target_batch_size=4096, peer_batch=8)
    return reports.SessionPace(**{**fields, **changes})


def make(seq: int, *, at: float = 0.0, samples: int = 40, speed: float = 10.0, epoch: int = 3) -> Report:
    """A report sent `at` seconds after NOW."""
    return Report(session_id=1, seq=seq, samples=samples, steps=5, local_epoch=epoch, samples_per_second=speed,
                  sent_at=NOW + datetime.timedelta(seconds=at))


def refusal(report: Report, session_pace: reports.SessionPace) -> str | None:
    refused = reports.report_check(report=report, pace=session_pace, now=NOW)
    return refused.code if refused else None


def warmed_up(speed: float = 10.0) -> reports.SessionPace:
    """A session that sent WARMUP_REPORTS reports at `speed`, one every 4 s, the last at NOW."""
    session_pace = pace()
    for seq in range(1, reports.WARMUP_REPORTS + 1):
        session_pace.accept(make(seq, at=4.0 * (seq - reports.WARMUP_REPORTS), samples=int(speed * 4), speed=speed))
    return session_pace


def test_every_rule_has_a_name_a_function_and_a_docstring():
    assert [code for code, _ in reports.RULES] == [rule.__name__ for _, rule in reports.RULES]
    assert all(rule.__doc__ for _, rule in reports.RULES)


def test_an_honest_agents_reports_pass_every_rule():
    session_pace = warmed_up()
    assert refusal(make(11, at=4.0, samples=40), session_pace) is None
    assert refusal(make(1, at=-3000.0), pace()) is None, "a session's first report"


def test_sent_in_future_refuses_a_clock_far_ahead_and_tolerates_skew():
    assert refusal(make(1, at=reports.CLOCK_SKEW.total_seconds() + 1), pace()) == "sent_in_future"
    assert refusal(make(1, at=reports.CLOCK_SKEW.total_seconds() - 1), pace()) is None


def test_sent_before_session_refuses_work_from_before_the_join():
    assert refusal(make(1, at=-3600 - reports.CLOCK_SKEW.total_seconds() - 1), pace()) == "sent_before_session"


def test_local_epoch_backwards_allows_a_resync_of_one_epoch_only():
    session_pace = warmed_up()  # at epoch 3
    assert refusal(make(11, at=4.0, epoch=3 - reports.EPOCH_RESYNC), session_pace) is None
    assert refusal(make(11, at=4.0, epoch=3 - reports.EPOCH_RESYNC - 1), session_pace) == "local_epoch_backwards"


def test_samples_beyond_run_pace_allows_more_as_more_epochs_pass():
    session_pace = pace(target_batch_size=64)
    session_pace.accept(make(1, samples=8, speed=0.0))
    limit = int(reports.RUN_PACE_SLACK * 64)
    assert refusal(make(2, at=10.0, samples=limit + 1, speed=1e5), session_pace) == "samples_beyond_run_pace"
    assert refusal(make(2, at=10.0, samples=limit * 2, speed=1e5, epoch=4), session_pace) is None


def test_samples_beyond_run_pace_allows_what_the_session_computes_while_its_view_of_the_run_lags():
    # After an epoch, hivemind accumulates into the new one until its next fetch of the run's
    # progress; a slow fetch lets an honest peer gather several target batches in one epoch.
    session_pace = pace(target_batch_size=32)
    session_pace.accept(make(1, samples=40, speed=40.0))
    lagging = int(reports.RUN_PACE_SLACK * 32 + 40.0 * reports.PROGRESS_LAG)
    assert refusal(make(2, at=60.0, samples=lagging, speed=40.0), session_pace) is None
    assert refusal(make(2, at=60.0, samples=lagging + 1, speed=1e5), session_pace) == "samples_beyond_run_pace"


def test_a_sessions_first_report_is_allowed_what_its_own_speed_computes_while_the_round_is_arranged():
    """An agent's first 2 s at 68 samples/s, all in one epoch of a run of 32 per epoch: accepted. With no accepted
    speed yet, its own claimed speed stands in, no further than its device could train."""
    first = pace(target_batch_size=32)
    assert refusal(make(1, samples=136, speed=68.0, epoch=1), first) is None
    assert refusal(make(1, samples=int(68.0 * reports.PROGRESS_LAG) + 65, speed=68.0, epoch=1),
                   first) == "samples_beyond_run_pace"
    slow_device = pace(target_batch_size=32, samples_ceiling=10.0)
    assert refusal(make(1, samples=136 + 10 * 60, speed=1e4, epoch=1), slow_device) == "samples_beyond_run_pace"


def test_a_sudden_speed_up_is_accepted_and_raises_the_sessions_best_by_at_most_the_jump():
    """An honest agent on a loaded host that the load leaves speeds up 8× (tests/e2e/test_preemption.py):
    its report is accepted; the best speed, which widens the pace's allowance, grows step by step."""
    jump = 10.0 * reports.SPEED_JUMP + 1
    warm = warmed_up()
    best = warm.max_speed
    assert refusal(make(11, at=100.0, samples=40, speed=jump * best), warm) is None
    warm.accept(make(11, at=100.0, samples=40, speed=jump * best))
    assert warm.max_speed == reports.SPEED_JUMP * best
    early = pace()
    early.accept(make(1, samples=40))
    early.accept(make(2, at=100.0, samples=40, speed=jump))
    assert early.max_speed == jump, "the first reports' speeds count as claimed"


def test_samples_beyond_session_budget_counts_every_report_on_the_portals_clock():
    """A session an hour old on a device of at most 10 samples/s: 36,000 samples plus one target
    batch in all, however the reports are spread, sequenced or dated."""
    session_pace = pace(samples_ceiling=10.0, target_batch_size=64)
    budget = 10 * 3600 + 64
    session_pace.counted = budget - 40
    assert refusal(make(50, samples=40), session_pace) is None
    assert refusal(make(51, samples=41), session_pace) == "samples_beyond_session_budget"
    assert refusal(make(2, samples=41, at=-3000.0), session_pace) == "samples_beyond_session_budget", "whatever its seq"


def test_speed_beyond_device_refuses_a_speed_no_such_device_reaches_from_the_first_report():
    assert refusal(make(1, speed=10.0), pace(samples_ceiling=10.0)) is None
    assert refusal(make(1, speed=10.5), pace(samples_ceiling=10.0)) == "speed_beyond_device"


def test_local_epoch_ahead_of_swarm_bounds_epochs_by_the_monitors_reading_when_there_is_one():
    assert refusal(make(1, epoch=10**6), pace()) is None, "no reading of the swarm: no bound"
    at_swarm = pace(swarm_epoch=3)
    assert refusal(make(1, epoch=3 + reports.SWARM_EPOCH_AHEAD), at_swarm) is None
    assert refusal(make(1, epoch=4 + reports.SWARM_EPOCH_AHEAD), at_swarm) == "local_epoch_ahead_of_swarm"


def test_late_and_resent_reports_are_judged_on_their_own():
    session_pace = warmed_up()
    # Report 3 arriving after 10, with 10's epoch far ahead, breaks no ordering rule.
    assert refusal(make(3, at=-28.0, samples=40, epoch=1), session_pace) is None


@pytest.mark.django_db(transaction=True)
def test_the_pace_is_seeded_from_the_latest_stored_report(session):
    exchange(session.secret, [report(session.pk, 1), report(session.pk, 2, local_epoch=7)])
    seeded = reports.session_pace(session=TrainingSession.objects.select_related("run").get(pk=session.pk))
    assert (seeded.last.seq, seeded.last.local_epoch, seeded.max_speed) == (2, 7, 12.5)
    assert seeded.target_batch_size == session.run.config["training"]["target_batch_size"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"sent_at": "2099-01-01T00:00:00+00:00"}, "sent_in_future"),
        ({"sent_at": "2001-01-01T00:00:00+00:00"}, "sent_before_session"),
        ({"samples": 10_000_000, "samples_per_second": 1e6}, "samples_beyond_run_pace"),
        ({"local_epoch": 0}, "local_epoch_backwards"),
    ],
)
def test_an_implausible_report_is_refused_recorded_and_not_credited_and_the_socket_goes_on(session, changes, code):
    answers = exchange(session.secret, [report(session.pk, 1), report(session.pk, 2, **changes), report(session.pk, 3)])
    assert answers[0] == {"type": "ack", "seq": 1}
    assert (answers[1]["type"], answers[1]["seq"], answers[1]["code"]) == ("error", 2, code)
    assert answers[2] == {"type": "ack", "seq": 3}
    assert total(session) == 64
    assert list(ContributionEvent.objects.values_list("seq", flat=True).order_by("seq")) == [1, 3]
    rejection = ReportRejection.objects.get()
    assert (rejection.session_id, rejection.seq, rejection.code) == (session.pk, 2, code)


@pytest.mark.django_db(transaction=True)
def test_a_speed_jump_after_the_warm_up_is_accepted_over_the_socket(session):
    frames = [report(session.pk, seq) for seq in range(1, reports.WARMUP_REPORTS + 1)]
    seq = reports.WARMUP_REPORTS + 1
    frames.append(report(session.pk, seq, samples_per_second=12.5 * reports.SPEED_JUMP * 2))
    answers = exchange(session.secret, frames)
    assert answers[-1] == {"type": "ack", "seq": seq}
    assert total(session) == 32 * (reports.WARMUP_REPORTS + 1)


@pytest.mark.django_db(transaction=True)
def test_a_refusal_on_one_session_leaves_the_volunteers_other_session_alone(session):
    other = TrainingSession.objects.create(
        run=session.run, user=session.user, token=session.token, peer_public_key="ssh-rsa BBBB", agent_version="0.1.0",
        access_expires_at=session.access_expires_at)
    answers = exchange(session.secret, [
        report(session.pk, 1), report(other.pk, 1), report(session.pk, 2, sent_at="2099-01-01T00:00:00+00:00"),
        report(other.pk, 2),
    ])
    assert [answer["type"] for answer in answers] == ["ack", "ack", "error", "ack"]
    assert (total(session), total(other)) == (32, 64)


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_on_the_same_connection_is_acknowledged_without_being_judged_again(session):
    # Report 2 was fine when it came; resent much later it would look slow, yet it is only acked.
    answers = exchange(session.secret, [report(session.pk, 1), report(session.pk, 2), report(session.pk, 2)])
    assert answers == [{"type": "ack", "seq": 1}, {"type": "ack", "seq": 2}, {"type": "ack", "seq": 2}]
    assert total(session) == 64


@pytest.mark.django_db(transaction=True)
def test_a_seq_gap_is_accepted_and_the_missing_report_counts_when_it_arrives(session):
    answers = exchange(session.secret, [report(session.pk, 1), report(session.pk, 4), report(session.pk, 2)])
    assert [answer["type"] for answer in answers] == ["ack", "ack", "ack"]
    assert total(session) == 96
    assert not ReportRejection.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_flood_is_refused_beyond_the_rate_limit_and_recorded_once(session, monkeypatch):
    """The per-connection limit (REPORTS_PER_SECOND after a BURST) answers rate_limited; a flood
    leaves one ReportRejection, not one per frame."""
    from runs.ingest import consumers
    from runs.ingest.consumers import BURST

    monkeypatch.setattr(consumers, "REPORTS_PER_SECOND", 1e-6)  # no refill however slow the machine

    async def flood() -> list[dict]:
        headers = [(b"authorization", f"Bearer {session.secret}".encode())]
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        await communicator.connect(timeout=10)
        for seq in range(1, BURST + 21):
            await communicator.send_to(text_data=json.dumps(report(session.pk, seq, samples=1)))
        answers = [json.loads(await communicator.receive_from(timeout=10)) for _ in range(BURST + 20)]
        await communicator.disconnect()
        return answers

    answers = async_to_sync(flood)()
    limited = [answer for answer in answers if answer.get("code") == "rate_limited"]
    assert len(limited) == 20 and [answer["seq"] for answer in limited] == list(range(BURST + 1, BURST + 21))
    assert ReportRejection.objects.filter(code="rate_limited").count() == 1
    assert total(session) == BURST
