"""Rate limits: log-in per IP and username, sign-up per IP, token creation per volunteer, joins per
agent token. Counted atomically in the cache (locmem by default, Redis when REDIS_URL is set)."""

import json
import threading
import uuid

import pytest
from django.core.cache import cache
from django.urls import reverse

from accounts.services import token_create
from portal import ratelimit
from portal.ratelimit import RateLimited, rate_limit_hit
from tests.factories import PASSWORD, RunFactory
from tests.runs.test_join_api import join_body

DAY = 86400


@pytest.fixture
def limits(settings):
    """Low limits and fresh counters; a day-long window so that no test straddles two windows."""
    cache.clear()
    settings.RATE_LIMITS = {"login": (3, DAY), "signup": (2, DAY), "token_create": (2, DAY), "join": (2, DAY),
                            "refresh": (2, DAY)}
    yield settings.RATE_LIMITS
    cache.clear()


def test_the_counter_refuses_past_the_limit_and_says_when_to_retry(limits):
    key = str(uuid.uuid4())
    for _ in range(3):
        rate_limit_hit(name="login", key=key)
    with pytest.raises(RateLimited) as refused:
        rate_limit_hit(name="login", key=key)
    assert 1 <= refused.value.retry_after <= DAY
    rate_limit_hit(name="login", key=str(uuid.uuid4()))  # another key has its own count


def test_a_new_window_starts_a_new_count(limits, monkeypatch):
    key = str(uuid.uuid4())
    for _ in range(3):
        rate_limit_hit(name="login", key=key)
    later = ratelimit.time.time() + DAY
    monkeypatch.setattr(ratelimit.time, "time", lambda: later)
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
        return client.post("/api/v1/runs/open-run/join", json.dumps(join_body()), content_type="application/json",
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
    joined = client.post("/api/v1/runs/open-run/join", json.dumps(join_body()), content_type="application/json",
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

