"""A token's open agent sockets are counted across web processes through leases in Redis
(runs/ingest/token_sockets.py): each ``SocketLeases`` here is what one web process holds, both on a
redis-server of the test's own, which it kills to see what an outage does."""

import logging
import time

import pytest
import redis

from runs.ingest import consumers
from runs.ingest.token_sockets import SocketLeases, SocketsInProcess, leases_key
from tests.agent_wire import exchange, report
from tests.processes import RedisServer

TOKEN = 7


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def process_of(server: RedisServer, lease_seconds: float = 30) -> SocketLeases:
    """What one web process holds (its renewal is not started: the tests call ``renew`` themselves)."""
    return SocketLeases(url=server.url, lease_seconds=lease_seconds)


def test_in_one_process_a_token_gets_its_limit_and_a_closed_socket_frees_its_place():
    sockets = SocketsInProcess()
    held = [sockets.admit(token_id=TOKEN, limit=3) for _ in range(3)]
    assert None not in held and sockets.admit(token_id=TOKEN, limit=3) is None
    assert sockets.admit(token_id=TOKEN + 1, limit=3), "another token counts on its own"
    sockets.release(token_id=TOKEN, socket_id=held[0])
    assert sockets.admit(token_id=TOKEN, limit=3)


def test_the_limit_holds_across_processes_whichever_one_a_socket_lands_on(redis_server):
    first, second = process_of(redis_server), process_of(redis_server)
    held = [(process, process.admit(token_id=TOKEN, limit=16)) for process in [first, second] * 8]
    assert None not in [socket for _, socket in held]
    assert first.admit(token_id=TOKEN, limit=16) is None
    assert second.admit(token_id=TOKEN, limit=16) is None
    process, socket = held[0]
    process.release(token_id=TOKEN, socket_id=socket)
    assert second.admit(token_id=TOKEN, limit=16), "a closed socket frees its place in every process"
    assert second.admit(token_id=TOKEN, limit=16) is None


def test_the_sockets_of_a_killed_process_stop_counting_once_their_leases_lapse(redis_server):
    # The live one's lease is long: a busy machine that runs this loop late must not let it lapse too.
    killed, alive = process_of(redis_server, lease_seconds=3), process_of(redis_server, lease_seconds=30)
    assert alive.admit(token_id=TOKEN, limit=4)
    assert all(killed.admit(token_id=TOKEN, limit=4) for _ in range(3))  # then it dies: nothing renews or drops them
    assert alive.admit(token_id=TOKEN, limit=4) is None
    waited = time.monotonic()
    while (admitted := alive.admit(token_id=TOKEN, limit=4)) is None:
        assert time.monotonic() - waited < 60, "the killed process's leases never lapsed"
        time.sleep(0.1)
    assert admitted and alive.admit(token_id=TOKEN, limit=4)
    assert alive.admit(token_id=TOKEN, limit=4) and alive.admit(token_id=TOKEN, limit=4) is None, \
        "the three places of the killed process, and no more"


def test_a_renewal_extends_the_leases_of_the_sockets_the_process_holds(redis_server):
    holder = process_of(redis_server, lease_seconds=30)
    socket = holder.admit(token_id=TOKEN, limit=4)
    client = redis.Redis.from_url(redis_server.url)
    client.zadd(leases_key(TOKEN), {socket: 1})  # as if its lease were about to lapse
    holder.renew()
    assert client.zscore(leases_key(TOKEN), socket) > time.time() * 1000 + 20_000
    assert 20_000 < client.pttl(leases_key(TOKEN)) <= 30_000, "the token's key goes once every lease has lapsed"
    holder.release(token_id=TOKEN, socket_id=socket)
    holder.renew()
    assert client.zcard(leases_key(TOKEN)) == 0, "a closed socket's lease is dropped, and not renewed"


def test_while_redis_is_away_each_process_counts_its_own_sockets_and_they_count_everywhere_once_it_is_back(
        redis_server, caplog):
    away, other = process_of(redis_server), process_of(redis_server)
    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="runs.ingest.token_sockets"):
        held = [away.admit(token_id=TOKEN, limit=2) for _ in range(2)]
        assert None not in held, "volunteers are not locked out for the portal's own fault"
        assert away.admit(token_id=TOKEN, limit=2) is None, "the process still bounds a token's sockets"
        away.release(token_id=TOKEN, socket_id=held[0])
        away.renew()
        assert away.admit(token_id=TOKEN, limit=2)
    outage = [record.getMessage() for record in caplog.records]
    assert len(outage) == 1 and "Redis does not answer" in outage[0], "one warning for the outage, not one per socket"
    caplog.clear()
    redis_server.start()
    with caplog.at_level(logging.WARNING, logger="runs.ingest.token_sockets"):
        away.renew()
    assert "Redis answers again" in caplog.text
    assert other.admit(token_id=TOKEN, limit=2) is None, "the renewal wrote the leases of the sockets held meanwhile"


@pytest.mark.django_db(transaction=True)
def test_an_agent_connects_and_reports_while_redis_is_away(session, redis_server, monkeypatch):
    leases = process_of(redis_server)
    monkeypatch.setattr(consumers, "token_sockets", leases)
    redis_server.kill()
    try:
        assert exchange(session.secret, [report(session.pk, 1)]) == [{"type": "ack", "seq": 1}]
    finally:
        leases.stopped.set()
    assert not leases.here.held, "its socket closed: it no longer counts"
