"""The API's answers that every anonymous reader is given alike are kept in Redis and sent again ahead of
Django (portal/snapshots.py): the same answer Django gives, never one older than the boards' version, never
one reader's answer to another, and Django's own answer whenever Redis is away. Through the real ASGI
application (portal/asgi.py) and a redis-server of the test's own."""

import json

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.db import transaction

from portal.asgi import application
from portal.metrics import SNAPSHOTS
from portal.snapshots import VERSION_KEY
from runs.credit.rollup import credit_rollup
from runs.models import CreditRollup, Run
from tests.factories import RunFactory, UserFactory, report, session_for
from tests.processes import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)
BOARD = "/api/v1/runs/crowd-run/leaderboard"


@pytest.fixture
def redis_server(tmp_path, settings):
    server = RedisServer(tmp_path)
    server.start()
    settings.REDIS_URL = server.url  # the snapshots' Redis; the cache and channel layer stay as configured
    yield server
    server.kill()


@pytest.fixture
def crowd(redis_server):
    run = RunFactory(slug="crowd-run")
    amina, badal = UserFactory(username="amina", display_name="Amina R."), UserFactory(username="badal")
    report(session_for(run, amina), 300)
    report(session_for(run, badal), 200)
    credit_rollup()  # publishes the boards' version once its transaction commits
    return run, amina


def get(path: str, headers: list[tuple[bytes, bytes]] = (), host: bytes = b"localhost") -> tuple[int, dict, bytes]:
    async def ask():
        communicator = HttpCommunicator(application, "GET", path, headers=[(b"host", host), *headers])
        answer = await communicator.get_response(timeout=30)
        await communicator.wait(timeout=30)  # as a server does: the application runs to its end (keeps the answer)
        return answer

    answer = async_to_sync(ask)()
    return answer["status"], {name.decode().lower(): value.decode() for name, value in answer["headers"]}, answer["body"]


def sent() -> float:
    return SNAPSHOTS.labels(outcome="sent")._value.get()


def names(body: bytes) -> list[str]:
    return [row["name"] for row in json.loads(body)]


@pytest.mark.parametrize("path", [BOARD, BOARD + "?by=team&window=7d", "/api/v1/leaderboard?limit=5",
                                  "/api/v1/runs/", "/api/v1/runs/crowd-run/"])
def test_a_second_read_is_sent_from_the_snapshot_and_is_djangos_answer(crowd, path):
    status, headers, body = get(path)
    assert status == 200 and headers["cache-control"] == "public, max-age=0"
    before = sent()
    again_status, again_headers, again = get(path)
    assert sent() == before + 1, "the second read never reached Django"
    assert (again_status, again) == (status, body)
    assert {name: value for name, value in again_headers.items() if name != "x-request-id"} == \
        {name: value for name, value in headers.items() if name != "x-request-id"}, "Django's headers, security's too"
    assert again_headers["x-request-id"] != headers["x-request-id"], "each answer has its own request id"


def test_a_change_a_board_shows_is_in_the_next_answer(crowd):
    run, amina = crowd
    assert names(get(BOARD)[2]) == ["Amina R.", "badal"]
    amina.display_name = "Amina Rahman"
    amina.save(update_fields=["display_name"])
    assert names(get(BOARD)[2]) == ["Amina Rahman", "badal"]
    report(session_for(run, UserFactory(username="chandra"), machine="desk"), 900)
    credit_rollup()
    assert names(get(BOARD)[2]) == ["chandra", "Amina Rahman", "badal"]
    assert names(get(BOARD)[2]) == ["chandra", "Amina Rahman", "badal"]


def test_a_run_closed_to_members_is_never_sent_from_its_public_snapshot(crowd):
    run = crowd[0]
    assert get(BOARD)[0] == 200 and get("/api/v1/runs/")[0] == 200
    run.audience = Run.Audience.MEMBERS
    run.save(update_fields=["audience"])
    assert get(BOARD)[0] == 404
    assert "crowd-run" not in [summary["slug"] for summary in json.loads(get("/api/v1/runs/")[2])]


def test_a_members_only_board_is_never_kept(crowd, client, organizer):
    run = crowd[0]
    run.organizers.add(organizer)
    Run.objects.filter(pk=run.pk).update(audience=Run.Audience.MEMBERS)
    with transaction.atomic():
        CreditRollup.boards_changed()
    client.force_login(organizer)
    assert client.get(BOARD, HTTP_HOST="localhost").status_code == 200
    assert "cache-control" not in {name.lower() for name in client.get(BOARD, HTTP_HOST="localhost").headers}
    assert get(BOARD)[0] == 404


def test_readers_with_a_cookie_or_a_token_and_other_hosts_always_reach_django(crowd):
    get(BOARD)
    before = sent()
    assert get(BOARD, [(b"cookie", b"sessionid=x")])[0] == 200
    assert get(BOARD, [(b"authorization", b"Bearer x")])[0] == 200
    assert get(BOARD, [(b"accept-language", b"bn")])[0] == 200
    assert sent() == before, "none of these was the kept reader's request"
    assert get(BOARD, host=b"evil.example")[0] == 400, "Django's host check, never the kept answer of another host"


def test_without_a_published_version_or_without_redis_django_answers(crowd, redis_server):
    redis.Redis.from_url(redis_server.url).delete(VERSION_KEY)
    before = sent()
    assert names(get(BOARD)[2]) == names(get(BOARD)[2]) == ["Amina R.", "badal"]
    assert sent() == before, "nothing is sent from a snapshot before a version is published"
    redis_server.kill()
    assert names(get(BOARD)[2]) == ["Amina R.", "badal"], "Redis away: Django answers"
