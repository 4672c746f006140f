"""Exactly-once under faults, over real websockets against the real server (uvicorn): whatever is
resent, reordered, duplicated or cut off between the commit and the ack, each report counts once."""

import asyncio
import datetime
import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn
import websockets
from django.db.models import Sum

from portal.asgi import application
from runs.ingest import reports
from runs.models import ContributionEvent, TrainingSession
from tests.agent_wire import report, total

pytestmark = pytest.mark.django_db(transaction=True)


def socket_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws/agent/"


async def send_each(url: str, secret: str, frames: list[dict]) -> list[dict]:
    """One connection: send each frame, read its answer; return the answers."""
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {secret}"}) as ws:
        answers = []
        for frame in frames:
            await ws.send(json.dumps(frame))
            answers.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=20)))
        return answers


def seqs_stored(session) -> list[int]:
    return sorted(ContributionEvent.objects.filter(session=session).values_list("seq", flat=True))


def test_a_reconnecting_agent_that_resends_duplicates_and_reorders_is_counted_once(session, asgi_server):
    url = socket_url(asgi_server)
    first = asyncio.run(send_each(url, session.secret, [report(session.pk, seq) for seq in range(1, 6)]))
    assert [answer["type"] for answer in first] == ["ack"] * 5
    resent = [5, 3, 1, 6, 6, 2, 8, 7, 4, 8]
    again = asyncio.run(send_each(url, session.secret, [report(session.pk, seq) for seq in resent]))
    assert again == [{"type": "ack", "seq": seq} for seq in resent]
    assert seqs_stored(session) == list(range(1, 9))
    assert total(session) == 8 * 32


@contextmanager
def serving():
    """uvicorn with the portal in a thread of this process (sharing the test database), stopped on exit
    at once, the way a crash or a deploy cuts open connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"ws://127.0.0.1:{port}/ws/agent/"
    finally:
        server.should_exit = server.force_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "uvicorn did not stop"


def test_a_report_stored_before_the_portal_went_down_and_resent_after_it_came_back_counts_once(
        session, transactional_db, monkeypatch):
    committed = threading.Event()
    real_writer = reports.report_writer

    class DiesAfterCommit:
        """The portal stops between storing report 2 and acknowledging it."""

        async def store(self, *, session_id, report, **options):
            await real_writer.store(session_id=session_id, report=report, **options)
            if report.seq == 2:
                committed.set()
                await asyncio.Future()  # the ack never leaves: the process is going down

    async def send_and_lose_the_ack(url: str) -> list[dict]:
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {session.secret}"}) as ws:
            await ws.send(json.dumps(report(session.pk, 1)))
            answers = [json.loads(await ws.recv())]
            await ws.send(json.dumps(report(session.pk, 2)))
            assert await asyncio.to_thread(committed.wait, 20)
            return answers

    monkeypatch.setattr(reports, "report_writer", DiesAfterCommit())
    with serving() as url:
        assert asyncio.run(send_and_lose_the_ack(url)) == [{"type": "ack", "seq": 1}]
        assert seqs_stored(session) == [1, 2], "report 2 was committed, its ack never read"
    monkeypatch.setattr(reports, "report_writer", real_writer)
    with serving() as url:
        # The agent's spool still holds 2 (never acknowledged) and goes on with 3.
        answers = asyncio.run(send_each(url, session.secret, [report(session.pk, 2), report(session.pk, 3)]))
    assert answers == [{"type": "ack", "seq": 2}, {"type": "ack", "seq": 3}]
    assert seqs_stored(session) == [1, 2, 3]
    assert total(session) == 96


def test_concurrent_sessions_of_one_volunteer_and_two_connections_of_one_session_count_exactly(session, asgi_server):
    url = socket_url(asgi_server)
    sessions = [session] + [
        TrainingSession.objects.create(
            run=session.run, user=session.user, token=session.token, peer_public_key=f"ssh-rsa K{i}",
            agent_version="0.1.0", access_expires_at=datetime.datetime.now(datetime.UTC))
        for i in range(3)
    ]

    async def everyone() -> list[list[dict]]:
        connections = [send_each(url, session.secret, [report(each.pk, seq, samples=10 + i) for seq in range(1, 31)])
                       for i, each in enumerate(sessions)]
        # The first session's agent restarted while its old connection still sends: same seqs twice.
        connections.append(send_each(url, session.secret, [report(session.pk, seq, samples=10)
                                                          for seq in range(30, 0, -1)]))
        return await asyncio.gather(*connections)

    answers = asyncio.run(everyone())
    assert all(answer["type"] == "ack" for answers_of_one in answers for answer in answers_of_one)
    for i, each in enumerate(sessions):
        assert seqs_stored(each) == list(range(1, 31))
        assert total(each) == 30 * (10 + i)
    everything = ContributionEvent.objects.filter(session__user=session.user).aggregate(total=Sum("samples"))["total"]
    assert everything == 30 * (10 + 11 + 12 + 13)


def test_a_stored_report_marks_its_session_seen_after_the_ack(session, asgi_server, monkeypatch):
    # The writer notes a session seen at most every few seconds, by session id, for the whole process:
    # an earlier test's session of the same id (ids restart with each test database) must not count.
    monkeypatch.setattr(reports.report_writer, "_seen_at", {})
    long_ago = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    TrainingSession.objects.filter(pk=session.pk).update(last_seen_at=long_ago)
    assert asyncio.run(send_each(socket_url(asgi_server), session.secret, [report(session.pk, 1)]))[0]["type"] == "ack"
    deadline = time.monotonic() + 20
    while TrainingSession.objects.get(pk=session.pk).last_seen_at == long_ago:
        assert time.monotonic() < deadline, "last_seen_at was never updated"
        time.sleep(0.05)
