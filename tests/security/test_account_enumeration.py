"""Password reset and sign-up never tell whether an address has an account, and reset mails are
limited per asking address and per address mailed. Sign-up creates an account only from the link
mailed to the address, once; the owner of a taken address is mailed a notice instead."""

import datetime
import re
from contextlib import contextmanager

import pytest
from django.core import mail
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from accounts import password_reset
from accounts import signup as signups
from accounts.models import PendingSignUp, User
from tests.factories import PASSWORD, sign_up, signup_link_in

DAY = 86400
ASKER = "198.51.100.30"
TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:")


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
    monkeypatch.setattr(password_reset.password_reset_email_task, "delay", lambda **kwargs: queued.append(kwargs["email"]))
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


def signup(client, email: str, username: str = "amina", ip: str = ASKER):
    return client.post(reverse("signup"), {"username": username, "email": email, "password1": PASSWORD,
                                           "password2": PASSWORD}, REMOTE_ADDR=ip)


@contextmanager
def statements():
    """The SQL a block runs, as sent to the database: each statement with its parameters apart."""
    seen = []

    def record(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def named(seen: list, email: str) -> list:
    """The statements with the address and the clock in their parameters named, not written."""
    def name(value):
        return "<address>" if value == email else "<time>" if TIME.match(str(value)) else value

    return [(sql, [name(value) for value in params or ()]) for sql, params in seen]


def test_sign_up_answers_the_same_for_a_taken_and_a_free_address(limits, client, volunteer, monkeypatch):
    """The page keeps the sign-up and queues its mail; only the task looks the address up."""
    queued, hashed = [], []
    monkeypatch.setattr(signups.signup_email_task, "delay", lambda **kwargs: queued.append(kwargs["pending_id"]))
    # Unsalted, so that the two inserts read alike; and counted: both addresses pay for the hashing.
    monkeypatch.setattr("accounts.signup.make_password", lambda password: hashed.append(password) or f"hash:{password}")
    answers, queries = [], []
    for email in ("vik@example.org", "nobody@example.org"):
        with statements() as seen:
            response = signup(client, email)
        answers.append((response.status_code, response["Location"], response.content))
        queries.append(named(seen, email))
    assert answers[0] == answers[1] and answers[0][:2] == (302, reverse("signup-sent"))
    assert queries[0] == queries[1] and any("INSERT" in sql for sql, _ in queries[0])
    assert hashed == [PASSWORD, PASSWORD]
    assert len(queued) == 2 and mail.outbox == [] and User.objects.count() == 1
    page = client.get(reverse("signup-sent")).content.decode()
    assert "Check your e-mail" in page and "vik@example.org" not in page


def test_an_outsider_signing_up_with_a_taken_address_gets_nothing_and_its_owner_a_notice(client, settings, volunteer,
                                                                                          outsider):
    """oscar knows vik's address: he learns nothing, and no account nor password of his comes of it."""
    response = signup(client, "VIK@example.org", username="oscar-again")
    assert response.status_code == 302 and response["Location"] == reverse("signup-sent")
    [notice] = mail.outbox
    assert notice.to == ["vik@example.org"] and "tried to sign up" in notice.subject
    assert f"{settings.SITE_URL}/accounts/login/" in notice.body
    assert f"{settings.SITE_URL}/accounts/password_reset/" in notice.body
    assert "/accounts/signup/confirm/" not in notice.body + notice.alternatives[0][0]
    assert not User.objects.filter(username="oscar-again").exists() and not PendingSignUp.objects.exists()
    volunteer.refresh_from_db()
    assert volunteer.check_password(PASSWORD) and volunteer.email == "vik@example.org"


def test_the_link_of_a_free_address_creates_the_account_and_logs_in_once(client, db):
    signup(client, "amina@example.org")
    assert not User.objects.filter(username="amina").exists(), "no account before the link is opened"
    link = signup_link_in(mail.outbox[0])
    asked = client.get(link)
    assert asked.status_code == 200 and "amina@example.org" in asked.content.decode()
    assert not User.objects.filter(username="amina").exists(), "opening the link (as a mail scanner does) creates nothing"

    created = client.post(link)
    assert created.status_code == 302 and created["Location"] == reverse("tokens")
    amina = User.objects.get(username="amina")
    assert amina.email_verified and amina.check_password(PASSWORD)
    assert "Welcome, amina!" in client.get(reverse("tokens")).content.decode()
    assert not PendingSignUp.objects.exists()

    for again in (Client().post(link), Client().get(link)):
        assert again.status_code == 400 and "This link was used already" in again.content.decode()
    assert User.objects.filter(email="amina@example.org").count() == 1


def refused(link: str, reason: str) -> None:
    for response in (Client().get(link), Client().post(link)):
        page = response.content.decode()
        assert response.status_code == 400 and 'id="signup-failed"' in page and reason in page
        assert 'href="/accounts/signup/"' in page, "the page says what to do next"


def test_an_expired_link_gives_a_clear_page(client, settings, db):
    settings.EMAIL_VERIFICATION_DAYS = 3
    signup(client, "amina@example.org")
    PendingSignUp.objects.update(created_at=timezone.now() - datetime.timedelta(days=3, minutes=1))
    refused(signup_link_in(mail.outbox[0]), "This link has expired")
    assert not User.objects.filter(username="amina").exists()


def test_a_username_taken_since_the_sign_up_gives_a_clear_page(db):
    signup(Client(), "amina@example.org")
    late = signup_link_in(mail.outbox[0])
    assert sign_up(Client(), "Amina", "other@example.org").status_code == 302
    refused(late, "Someone took the username “amina”")
    assert not User.objects.filter(email="amina@example.org").exists()


def test_an_address_taken_since_the_sign_up_gives_a_clear_page(db):
    signup(Client(), "amina@example.org", username="amina")
    late = signup_link_in(mail.outbox[0])
    assert sign_up(Client(), "amina2", "Amina@example.org").status_code == 302
    refused(late, "An account with this e-mail address was created after you signed up")
    assert list(User.objects.values_list("username", flat=True)) == ["amina2"]


def test_an_altered_link_gives_a_clear_page(client, db):
    signup(client, "amina@example.org")
    link = signup_link_in(mail.outbox[0])
    refused(link[:-4] + ("AAA/" if not link.endswith("AAA/") else "BBB/"), "it is not valid")
    assert client.post(link).status_code == 302, "the real link still works"


def test_expired_sign_ups_are_forgotten_by_the_next_sign_up(client, settings, db):
    settings.EMAIL_VERIFICATION_DAYS = 3
    signup(client, "amina@example.org")
    PendingSignUp.objects.update(created_at=timezone.now() - datetime.timedelta(days=3, minutes=1))
    signup(client, "rahim@example.org", username="rahim")
    assert list(PendingSignUp.objects.values_list("username", flat=True)) == ["rahim"]


def test_sign_up_mails_to_one_address_stop_silently_past_the_limit(limits, client, volunteer):
    """Each sign-up with a registered address mails its owner a notice; past the limit per address no
    more go, and the page says nothing different (it must not tell whether one was sent)."""
    limits["signup_email"] = (2, DAY)
    answers = {signup(client, "vik@example.org", username=f"mallory{n}")["Location"] for n in range(4)}
    assert answers == {reverse("signup-sent")}
    assert [notice.to for notice in mail.outbox] == [["vik@example.org"]] * 2
