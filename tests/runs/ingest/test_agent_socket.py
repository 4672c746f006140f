"""`WS /ws/agent/`: token-authenticated reports, acknowledged after storage, counted exactly once."""

import asyncio
import datetime
import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from accounts.models import AgentToken
from accounts.services import token_create, token_revoke
from portal.asgi import application
from runs.ingest import consumers, reports
from runs.models import ContributionEvent, ReportRejection, TrainingSession
from runs.setup.services import run_ban
from tests.agent_wire import exchange, report, total
from tests.factories import RunFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_report_is_acknowledged_once_stored(session):
    answers = exchange(session.secret, [report(session.pk, 1), report(session.pk, 2)])
    assert answers == [{"type": "ack", "seq": 1}, {"type": "ack", "seq": 2}]
    assert total(session) == 64


def test_a_resent_report_is_acknowledged_and_not_counted_again(session):
    exchange(session.secret, [report(session.pk, 1), report(session.pk, 2)])
    answers = exchange(session.secret, [report(session.pk, 2), report(session.pk, 1), report(session.pk, 3)])
    assert [answer["type"] for answer in answers] == ["ack", "ack", "ack"]
    assert total(session) == 96


def test_reports_out_of_order_or_with_gaps_are_each_counted_once(session):
    # The spool resends whatever was not acknowledged, in any order; (session, seq) decides.
    exchange(session.secret, [report(session.pk, 5), report(session.pk, 2), report(session.pk, 9), report(session.pk, 5)])
    assert sorted(ContributionEvent.objects.values_list("seq", flat=True)) == [2, 5, 9]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "bad_json"),
        ("[1, 2]", "bad_json"),
        ({"type": "hello"}, "unknown_type"),
        ("REPORT", "bad_json"),
    ],
)
def test_malformed_frames_get_an_error_frame_and_no_credit(session, frame, code):
    if frame == "REPORT":
        frame = json.dumps(report(session.pk, 1, samples=-5))
        code = "invalid_report"
    answers = exchange(session.secret, [frame, report(session.pk, 2)])
    assert answers[0]["type"] == "error" and answers[0]["code"] == code
    assert answers[1] == {"type": "ack", "seq": 2}, "the connection survives a bad frame"
    assert total(session) == 32


def test_an_unknown_or_someone_elses_session_is_refused_and_recorded(session, outsider):
    _, other_secret = token_create(user=outsider, name="x")
    answers = exchange(other_secret, [report(session.pk, 1)])
    assert answers[0]["code"] == "session_not_found"
    assert total(session) == 0


def test_a_banned_volunteer_gets_no_more_credit(session, organizer):
    session.run.organizers.add(organizer)
    run_ban(run=session.run, actor=organizer, user=session.user)
    answers = exchange(session.secret, [report(session.pk, 1)])
    assert answers[0]["code"] == "banned"
    assert total(session) == 0
    assert ReportRejection.objects.get().code == "banned"


def test_reports_for_a_finished_run_are_refused(session):
    session.run.status = "finished"
    session.run.save()
    assert exchange(session.secret, [report(session.pk, 1)])[0]["code"] == "run_finished"


def test_a_paused_run_counts_work_done_before_the_pause_and_tells_the_agent_to_wait(session):
    session.run.status = "paused"
    session.run.save()

    async def run() -> list[dict]:
        headers = [(b"authorization", f"Bearer {session.secret}".encode())]
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        await communicator.connect(timeout=10)
        await communicator.send_to(text_data=json.dumps(report(session.pk, 1)))
        answers = [json.loads(await communicator.receive_from(timeout=10)) for _ in range(2)]
        await communicator.disconnect()
        return answers

    ack, notice = async_to_sync(run)()
    assert ack == {"type": "ack", "seq": 1}
    assert (notice["type"], notice["code"], notice["seq"]) == ("error", "run_paused", None)
    assert total(session) == 32


@pytest.mark.parametrize("header", [None, b"Bearer nope", b"Basic abc"])
def test_a_missing_or_bad_token_gets_an_error_frame(session, header):
    headers = [(b"authorization", header)] if header else []
    answers = exchange("x", [], headers=headers)
    assert answers[0]["type"] == "error"
    assert answers[0]["code"] in {"token_missing", "token_malformed"}


def test_a_revoked_token_is_refused(session):
    token_revoke(token=session.token)
    answers = exchange("x", [], headers=[(b"authorization", f"Bearer {session.secret}".encode())])
    assert answers[0]["code"] == "token_revoked"


def test_a_flood_is_rate_limited_without_closing_the_socket(session):
    frames = [report(session.pk, seq) for seq in range(1, 81)]
    answers = exchange(session.secret, frames)
    assert any(answer.get("code") == "rate_limited" for answer in answers)
    acked = [answer["seq"] for answer in answers if answer["type"] == "ack"]
    assert total(session) == 32 * len(acked)


@pytest.fixture
def recheck_now(monkeypatch):
    """Every report re-checks its run's admission (the portal does so every few seconds)."""
    monkeypatch.setattr(consumers.run_admissions, "max_age", 0.0)


def _finish(run) -> None:
    run.status = "finished"
    run.save(update_fields=["status"])


@pytest.mark.parametrize("change, code", [
    (lambda session: run_ban(run=session.run, actor=session.run.organizers.first(), user=session.user), "banned"),
    (lambda session: token_revoke(token=session.token), "token_revoked"),
    (lambda session: _finish(session.run), "run_finished"),
])
def test_a_ban_a_revoked_token_or_a_finished_run_stops_credit_on_an_open_connection(session, organizer, recheck_now,
                                                                                    change, code):
    session.run.organizers.add(organizer)
    answers = exchange(session.secret, [report(session.pk, 1), lambda: change(session), report(session.pk, 2)])
    assert answers[0] == {"type": "ack", "seq": 1}
    assert (answers[1]["type"], answers[1]["code"], answers[1]["seq"]) == ("error", code, 2)
    assert total(session) == 32
    assert ReportRejection.objects.get().code == code


def test_an_expired_token_stops_credit_on_an_open_connection(session, recheck_now):
    def expire() -> None:
        AgentToken.objects.filter(pk=session.token_id).update(expires_at=datetime.datetime.now(datetime.UTC))

    answers = exchange(session.secret, [report(session.pk, 1), expire, report(session.pk, 2)])
    assert answers[1]["code"] == "token_expired"
    assert total(session) == 32


def test_the_sockets_of_one_run_share_one_admission_check(monkeypatch):
    """Twenty agents re-checking together cost one fetch for their run, not one each."""
    run = RunFactory()
    sessions = []
    for index in range(20):
        user = UserFactory()
        token, secret = token_create(user=user, name=f"machine {index}")
        sessions.append((TrainingSession.objects.create(
            run=run, user=user, token=token, peer_public_key="ssh-rsa AAAA", agent_version="0.1.0",
            access_expires_at=datetime.datetime.now(datetime.UTC)), secret))
    fetches = []
    fetch = reports.run_admission

    def counted(**kwargs):
        fetches.append(kwargs["run_id"])
        return fetch(**kwargs)

    monkeypatch.setattr(reports, "run_admission", counted)
    monkeypatch.setattr(consumers, "run_admissions", reports.RunAdmissions(max_age=60.0))

    async def agent(session, secret) -> list[dict]:
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {secret}".encode())])
        assert (await communicator.connect(timeout=10))[0]
        answers = []
        for seq in (1, 2, 3):
            await communicator.send_to(text_data=json.dumps(report(session.pk, seq)))
            answers.append(json.loads(await communicator.receive_from(timeout=10)))
        await communicator.disconnect()
        return answers

    async def everyone() -> list[list[dict]]:
        return await asyncio.gather(*(agent(session, secret) for session, secret in sessions))

    answers = async_to_sync(everyone)()
    assert all(answer["type"] == "ack" for agent_answers in answers for answer in agent_answers), answers
    # Each socket's first report checks its session with a fetch of its own; the 40 later reports
    # read one shared admission.
    assert fetches == [run.pk] * (20 + 1)
    assert ContributionEvent.objects.filter(session__run=run).count() == 60


def test_reports_read_the_last_admission_while_the_next_is_fetched_until_it_is_twice_too_old(monkeypatch):
    """At 10,000 sockets every report waiting for the run's re-check held acks back by seconds."""
    fetched = []

    def fetch(*, run_id, token_ids) -> reports.RunAdmission:
        fetched.append(run_id)
        return reports.RunAdmission(status=f"answer {len(fetched)}", slug="", banned=frozenset(), refused_tokens={})

    monkeypatch.setattr(reports, "run_admission", fetch)
    now = [100.0]
    admissions = reports.RunAdmissions(max_age=5.0, clock=lambda: now[0])

    async def story() -> list[str]:
        seen = [(await admissions.admission(run_id=7, token_id=1)).status]  # nothing to read yet: it waits
        now[0] += 4.9
        seen.append((await admissions.admission(run_id=7, token_id=1)).status)  # fresh: no fetch
        now[0] += 0.2
        seen.append((await admissions.admission(run_id=7, token_id=1)).status)  # stale: a fetch starts, the last answer
        await admissions._fetches[asyncio.get_running_loop()][7][1]  # the fetch's thread answers
        await asyncio.sleep(0)
        seen.append((await admissions.admission(run_id=7, token_id=1)).status)
        now[0] += 10.0  # twice too old: the report waits for the next fetch
        seen.append((await admissions.admission(run_id=7, token_id=1)).status)
        return seen

    assert asyncio.run(story()) == ["answer 1", "answer 1", "answer 1", "answer 2", "answer 3"]
    assert fetched == [7, 7, 7]
