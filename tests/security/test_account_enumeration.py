"""Password reset and sign-up never tell whether an address has an account, and reset mails are
limited per asking address and per address mailed."""

import pytest
from django.core import mail
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts import tasks

DAY = 86400
ASKER = "198.51.100.30"


@pytest.fixture
def limits(settings):
    cache.clear()
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "reset_client": (4, DAY), "reset_email": (2, DAY)}
    yield settings.RATE_LIMITS
    cache.clear()


def reset(client, email: str, ip: str = ASKER):
    return client.post(reverse("password_reset"), {"email": email}, REMOTE_ADDR=ip)


def test_reset_answers_and_works_the_same_for_a_known_and_an_unknown_address(limits, client, volunteer, monkeypatch):
    """The page only queues the mail; the address is looked up by the task, off the request path."""
    queued = []
    monkeypatch.setattr(tasks.password_reset_email_task, "delay", lambda **kwargs: queued.append(kwargs["email"]))
    answers, queries = [], []
    for email in ("vik@example.org", "nobody@example.org"):
        with CaptureQueriesContext(connection) as captured:
            response = reset(client, email)
        answers.append((response.status_code, response["Location"], response.content))
        queries.append([query["sql"] for query in captured.captured_queries])
    assert answers[0] == answers[1] and answers[0][:2] == (302, reverse("password_reset_done"))
    assert queries[0] == queries[1]
    assert queued == ["vik@example.org", "nobody@example.org"]
    assert mail.outbox == []


def test_reset_mails_to_one_address_stop_silently_past_the_limit(limits, client, volunteer):
    answers = {reset(client, "vik@example.org", ip=f"198.51.100.{n}")["Location"] for n in range(40, 45)}
    assert answers == {reverse("password_reset_done")}, "the same page, mailed or not"
    assert len(mail.outbox) == 2


@pytest.mark.parametrize("email", ["vik@example.org", "nobody@example.org"])
def test_reset_asks_from_one_client_address_are_limited_alike_for_any_address(limits, client, volunteer, email):
    for n in range(4):
        assert reset(client, f"someone{n}@example.org").status_code == 302
    refused = reset(client, email)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Too many password resets asked from your address" in refused.content.decode()
    assert reset(client, email, ip="198.51.100.31").status_code == 302
