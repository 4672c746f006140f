"""Rate limits: log-in per IP and username, sign-up per IP, token creation per volunteer, joins per
agent token. Counted atomically in the cache (locmem by default, Redis when REDIS_URL is set)."""

import asyncio
import contextvars
import datetime
import json
import logging
import secrets
import threading
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.cache import cache
from django.urls import reverse

from accounts.services import token_create, token_revoke
from portal import ratelimit
from portal.asgi import application
from portal.ratelimit import RateLimited, rate_limit_check, rate_limit_hit
from tests.agent_wire import report
from tests.factories import PASSWORD, RunFactory, join_body

DAY = 86400


@pytest.fixture
def limits(settings):
    """Low limits and fresh counters; a day-long window so that no test straddles two windows."""
    cache.clear()
    settings.RATE_LIMITS = {"login": (3, DAY), "login_address": (5, DAY), "signup": (2, DAY), "token_create": (2, DAY),
                            "join": (2, DAY), "refresh": (2, DAY), "token_failures": (3, DAY)}
    yield settings.RATE_LIMITS
    cache.clear()


def test_the_counter_refuses_past_the_limit_and_says_when_to_retry(limits):
    key = str(uuid.uuid4())
    for _ in range(3):
        rate_limit_hit(name="login", key=key)
    with pytest.raises(RateLimited) as refused:
        rate_limit_hit(name="login", key=key)
    assert 1 <= refused.value.retry_after <= DAY + DAY // ratelimit.SLOTS  # the window slides a slot at a time
    rate_limit_hit(name="login", key=str(uuid.uuid4()))  # another key has its own count


def test_every_async_context_counts_in_the_one_cache_of_the_process(limits, monkeypatch):
    """`django.core.cache.cache` is one per async context: counted there, every agent socket (a context of
    its own) kept a Redis connection open for as long as it was open."""
    made = []
    create = ratelimit.caches.create_connection
    monkeypatch.setattr(ratelimit.caches, "create_connection", lambda alias: made.append(alias) or create(alias))
    ratelimit.counters.cache_clear()

    async def sockets_connect() -> None:
        check = sync_to_async(rate_limit_check, thread_sensitive=False)
        await asyncio.gather(*(check(name="token_failures", key=f"10.0.0.{i}") for i in range(20)))

    try:
        # A context of nothing, as uvicorn's: the sockets' tasks do not inherit this test's caches.
        contextvars.Context().run(asyncio.run, sockets_connect())
    finally:
        ratelimit.counters.cache_clear()
    assert made == ["default"]


def test_a_window_later_the_count_starts_afresh(limits, monkeypatch):
    key = str(uuid.uuid4())
    for _ in range(3):
        rate_limit_hit(name="login", key=key)
    later = ratelimit.time.time() + DAY + DAY // ratelimit.SLOTS  # past the slot that held the three
    monkeypatch.setattr(ratelimit.time, "time", lambda: later)
    rate_limit_hit(name="login", key=key)


def test_twice_the_limit_never_fits_across_a_window_boundary(limits, monkeypatch):
    """The window slides: three attempts just before a day's boundary still count just after it."""
    key, boundary = str(uuid.uuid4()), (ratelimit.time.time() // DAY + 1) * DAY
    monkeypatch.setattr(ratelimit.time, "time", lambda: boundary - 1)
    for _ in range(3):
        rate_limit_hit(name="login", key=key)
    monkeypatch.setattr(ratelimit.time, "time", lambda: boundary + 1)
    with pytest.raises(RateLimited) as refused:
        rate_limit_hit(name="login", key=key)
    retry_at = boundary + 1 + refused.value.retry_after
    assert boundary - 1 + DAY <= retry_at <= boundary + DAY + DAY // ratelimit.SLOTS + 1
    monkeypatch.setattr(ratelimit.time, "time", lambda: retry_at)
    rate_limit_hit(name="login", key=key)  # told when to come back, it is let in then


def test_a_refused_attempt_does_not_push_the_retry_time_back(limits, monkeypatch):
    key, now = str(uuid.uuid4()), ratelimit.time.time()
    for _ in range(3):
        rate_limit_hit(name="login", key=key)
    retry_afters = []
    for _ in range(5):
        with pytest.raises(RateLimited) as refused:
            rate_limit_hit(name="login", key=key)
        retry_afters.append(refused.value.retry_after)
    monkeypatch.setattr(ratelimit.time, "time", lambda: now + retry_afters[-1] + 1)
    rate_limit_hit(name="login", key=key)


def test_concurrent_attempts_never_get_past_the_limit(limits):
    """add + incr are atomic: of 40 simultaneous attempts exactly the limit's 3 get through."""
    key, allowed, start = str(uuid.uuid4()), [], threading.Barrier(40)

    def attempt():
        start.wait()
        try:
            rate_limit_hit(name="login", key=key)
        except RateLimited:
            return
        allowed.append(1)

    threads = [threading.Thread(target=attempt) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(allowed) == 3


def login(client, username: str, password: str, ip: str = "198.51.100.7"):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=ip)


def test_login_attempts_are_limited_per_address_and_username(limits, client, volunteer, outsider):
    for _ in range(3):
        assert login(client, "vik", "wrong").status_code == 200
    refused = login(client, "vik", PASSWORD)  # even the right password: the limit comes first
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert "Too many log-in attempts" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    assert login(client, "oscar", PASSWORD).status_code == 302, "another username is not affected"
    assert login(client, "vik", PASSWORD, ip="198.51.100.8").status_code == 302, "nor another address"


def test_one_address_trying_many_usernames_is_limited_across_them(limits, client, volunteer, outsider):
    """One password against many accounts: each username is tried once, the address meets its limit."""
    for n in range(5):
        assert login(client, f"guess{n}", "hunter2").status_code == 200
    refused = login(client, "oscar", PASSWORD)  # a sixth username, even with its right password
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Too many log-in attempts from your address" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    assert login(client, "oscar", PASSWORD, ip="198.51.100.8").status_code == 302, "another address is not affected"


def test_signups_are_limited_per_address(limits, client, db):
    for n in range(2):
        response = client.post(reverse("signup"), {"username": f"new{n}"}, REMOTE_ADDR="198.51.100.9")
        assert response.status_code == 200  # an invalid form still counts
    refused = client.post(reverse("signup"), {"username": "new3"}, REMOTE_ADDR="198.51.100.9")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Too many sign-ups" in refused.content.decode()


def test_token_creation_is_limited_per_volunteer_on_both_pages(limits, client_for, volunteer, organizer):
    page = client_for(volunteer)
    assert page.post(reverse("tokens"), {"name": "a", "lifetime_days": 9}).status_code == 200
    run = RunFactory(slug="open-run", organizers=[organizer])
    assert page.post(reverse("run-join", args=[run.slug]), {"action": "token"}).status_code == 200
    refused = page.post(reverse("tokens"), {"name": "c", "lifetime_days": 9})
    assert refused.status_code == 429 and "try again in" in refused.content.decode()
    refused = page.post(reverse("run-join", args=[run.slug]), {"action": "token"})
    assert refused.status_code == 429 and "try again in" in refused.content.decode()
    assert volunteer.agent_tokens.count() == 2


def test_joins_are_limited_per_agent_token_with_the_api_error_shape(limits, client, volunteer, organizer):
    RunFactory(slug="open-run", organizers=[organizer])
    _, secret = token_create(user=volunteer, name="laptop")
    _, other_secret = token_create(user=volunteer, name="desktop")

    def join(secret: str):
        return client.post("/api/v1/runs/open-run/join", json.dumps(join_body("open-run")), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {secret}")

    assert [join(secret).status_code for _ in range(2)] == [200, 200]
    refused = join(secret)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limited"
    assert "try again in" in refused.json()["error"]["detail"]
    assert join(other_secret).status_code == 200


def test_access_refreshes_are_limited_per_agent_token(limits, client, volunteer, organizer):
    RunFactory(slug="open-run", organizers=[organizer])
    _, secret = token_create(user=volunteer, name="laptop")
    _, other_secret = token_create(user=volunteer, name="desktop")
    joined = client.post("/api/v1/runs/open-run/join", json.dumps(join_body("open-run")), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {secret}")

    def refresh(secret: str):
        return client.post(f"/api/v1/sessions/{joined.json()['session_id']}/refresh", "{}",
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")

    assert [refresh(secret).status_code for _ in range(2)] == [200, 200]
    refused = refresh(secret)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limited"
    assert refresh(other_secret).status_code == 200, "another token of the same volunteer has its own count"



def me(client, secret: str, ip: str):
    return client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {secret}", REMOTE_ADDR=ip)


def a_guess() -> str:
    return "dlp_" + secrets.token_urlsafe(32)


@pytest.mark.parametrize("refusal", ["token_malformed", "token_unknown", "token_revoked", "token_expired"])
def test_every_refused_token_is_logged_with_address_and_code_but_never_the_secret(limits, client, volunteer, caplog,
                                                                                  refusal):
    revoked, revoked_secret = token_create(user=volunteer, name="old laptop")
    token_revoke(token=revoked)
    secret = {"token_malformed": "dlp_copied-half", "token_unknown": a_guess(), "token_revoked": revoked_secret,
              "token_expired": token_create(user=volunteer, name="x", lifetime=datetime.timedelta(seconds=-1))[1]}[refusal]
    with caplog.at_level(logging.INFO):
        response = me(client, secret, "203.0.113.5")
    assert response.status_code == 401 and response.json()["error"]["code"] == refusal
    [record] = [record for record in caplog.records if record.name == "accounts.services"]
    assert record.levelno == logging.WARNING
    assert refusal in record.getMessage() and "203.0.113.5" in record.getMessage()
    assert secret[len("dlp_"):] not in caplog.text


def test_an_honest_token_is_not_logged_as_refused(limits, client, volunteer, caplog):
    _, secret = token_create(user=volunteer, name="laptop")
    with caplog.at_level(logging.INFO, logger="accounts.services"):
        assert me(client, secret, "203.0.113.5").status_code == 200
    assert not [record for record in caplog.records if record.name == "accounts.services"]


def test_an_address_that_sends_too_many_refused_tokens_gets_429_and_other_addresses_do_not(limits, client, volunteer):
    _, secret = token_create(user=volunteer, name="laptop")
    assert [me(client, a_guess(), "203.0.113.5").status_code for _ in range(3)] == [401, 401, 401]
    refused = me(client, a_guess(), "203.0.113.5")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limited"
    assert me(client, secret, "203.0.113.5").status_code == 429, "past the limit, the address is refused every token"
    assert me(client, secret, "198.51.100.20").status_code == 200
    assert me(client, a_guess(), "198.51.100.20").status_code == 401, "and its failures are counted apart"


def agent_socket(secret: str, ip: str) -> tuple[dict, int | None]:
    """Connect to `WS /ws/agent/` from `ip`; the first answer to a report, and the close code that follows
    (None when the socket stayed open)."""

    async def exchange():
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {secret}".encode())])
        communicator.scope["client"] = [ip, 50000]  # read when the consumer starts, at connect()
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        try:
            await communicator.send_to(text_data=json.dumps(report(10**9, 1)))
            answer = json.loads(await communicator.receive_from(timeout=10))
            if answer.get("code") not in {"token_unknown", "rate_limited"}:
                return answer, None
            return answer, (await communicator.receive_output(timeout=10))["code"]
        finally:
            await communicator.disconnect()

    return async_to_sync(exchange)()


@pytest.mark.django_db(transaction=True)
def test_the_agent_socket_throttles_an_address_that_sends_too_many_refused_tokens(limits, volunteer):
    _, secret = token_create(user=volunteer, name="laptop")
    for _ in range(3):
        answer, closed = agent_socket(a_guess(), "203.0.113.5")
        assert (answer["code"], closed) == ("token_unknown", 4401)
    for attempt in (a_guess(), secret):
        answer, closed = agent_socket(attempt, "203.0.113.5")
        assert (answer["code"], closed) == ("rate_limited", 4429)
        assert "try again in" in answer["detail"]
    answer, closed = agent_socket(secret, "198.51.100.20")
    assert (answer["code"], closed) == ("session_not_found", None), "authenticated: only the session is unknown"
