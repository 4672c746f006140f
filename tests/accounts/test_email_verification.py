"""E-mail verification: the account made from the sign-up link has its address confirmed; a changed
address (or an account from before) gets a signed, expiring link and agent tokens wait for it; a link
that is expired, forged, or sent to an address no longer on the account is refused with the reason."""

import re
import time

import pytest
from django.core import mail, signing
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from accounts.models import AgentToken, User
from accounts.notifications import unsubscribe_link
from accounts.verification import verification_link, verification_send
from tests.factories import PASSWORD, RunFactory, UserFactory, signup_link_in

pytestmark = pytest.mark.django_db

SIGN_UP = {"username": "amina", "email": "amina@example.org", "password1": PASSWORD, "password2": PASSWORD}
NEW_TOKEN = {"name": "home desktop", "lifetime_days": 30}


def link_in(message) -> str:
    """The verification link of a mail, as a path (both the text and the HTML part carry it)."""
    links = re.findall(r"https?://[^/\s]+(/accounts/verify/[^\s\"<]+/)", message.body)
    html = message.alternatives[0][0]
    assert links and links[0] in html, "the plain text and the HTML part carry the same link"
    return links[0]


def test_the_account_made_from_the_sign_up_link_creates_tokens_at_once():
    client = Client()
    client.post(reverse("signup"), SIGN_UP)
    assert [m.to for m in mail.outbox] == [["amina@example.org"]]
    assert mail.outbox[0].alternatives[0][1] == "text/html"
    client.post(signup_link_in(mail.outbox[0]))
    amina = User.objects.get(username="amina")
    assert amina.email_verified
    created = client.post(reverse("tokens"), NEW_TOKEN)
    assert created.status_code == 200 and 'id="new-token-secret"' in created.content.decode()
    assert AgentToken.objects.filter(user=amina).count() == 1


def test_tokens_wait_until_the_address_is_confirmed(client_for):
    amina = UserFactory(username="amina", email_verified_at=None)
    verification_send(user=amina)
    client = client_for(amina)
    page = client.get(reverse("tokens")).content.decode()
    assert 'id="token-blocked"' in page and "amina@example.org" in page and 'name="lifetime_days"' not in page
    refused = client.post(reverse("tokens"), NEW_TOKEN)
    assert refused.status_code == 403 and not AgentToken.objects.exists()

    opened = client.get(link_in(mail.outbox[0]))
    assert opened.status_code == 302 and opened["Location"] == reverse("tokens")
    amina.refresh_from_db()
    assert amina.email_verified
    assert client.post(reverse("tokens"), NEW_TOKEN).status_code == 200
    assert AgentToken.objects.filter(user=amina).count() == 1


def test_the_link_works_logged_out_and_sends_to_the_log_in_page():
    verification_send(user=UserFactory(username="amina", email_verified_at=None))
    opened = Client().get(link_in(mail.outbox[0]))
    assert opened.status_code == 302 and opened["Location"] == reverse("login")
    assert User.objects.get(username="amina").email_verified


def test_an_expired_link_is_refused_with_what_to_do(monkeypatch, settings):
    settings.EMAIL_VERIFICATION_DAYS = 3
    verification_send(user=UserFactory(username="amina", email_verified_at=None))
    link = link_in(mail.outbox[0])
    later = time.time() + 3 * 86400 + 60
    monkeypatch.setattr(signing.time, "time", lambda: later)
    response = Client().get(link)
    assert response.status_code == 400
    assert "This link has expired" in response.content.decode()
    assert not User.objects.get(username="amina").email_verified


@pytest.mark.parametrize("forge", ["altered", "other-account", "unsubscribe-link"])
def test_a_forged_link_is_refused(forge):
    """A cheater edits the signed id, signs their own claim without the key, or replays another
    kind of signed link of the portal: none verifies anything."""
    amina = UserFactory(username="amina", email_verified_at=None)
    link = verification_link(user=amina).split("/accounts/verify/", 1)[1].strip("/")
    if forge == "altered":
        link = link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB")
    elif forge == "other-account":
        link = signing.dumps({"u": amina.pk, "e": "amina@example.org"}, key="not-the-portal-key",
                             salt="accounts.verification", compress=True)
    else:
        link = unsubscribe_link(user=amina, kind="run_paused").split("/unsubscribe/", 1)[1].strip("/")
    response = Client().get(reverse("email-verify", args=[link]))
    assert response.status_code == 400
    assert "This link is not valid" in response.content.decode()
    amina.refresh_from_db()
    assert not amina.email_verified


def test_changing_the_address_verifies_again_and_the_old_link_stops_working(client_for):
    amina = UserFactory(username="amina", email_verified_at=None)
    old_link = reverse("email-verify", args=[verification_link(user=amina).split("/accounts/verify/", 1)[1].strip("/")])
    amina.email_verified_at = amina.date_joined
    amina.save()
    client = client_for(amina)
    client.post(reverse("profile"), {"display_name": "", "email": "amina@new.example.org", "visibility": "public",
                                     "language": "en"})
    amina.refresh_from_db()
    assert amina.email == "amina@new.example.org" and not amina.email_verified
    assert [m.to for m in mail.outbox] == [["amina@new.example.org"]]
    assert client.post(reverse("tokens"), NEW_TOKEN).status_code == 403

    stale = client.get(old_link)
    assert stale.status_code == 400 and "no longer on the account" in stale.content.decode()
    client.get(link_in(mail.outbox[0]))
    amina.refresh_from_db()
    assert amina.email_verified


@pytest.fixture
def fresh_limits(settings):
    """The counters live in the cache, which outlives each test's database: start from zero."""
    cache.clear()
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "verify_resend": (2, 3600)}


def test_a_new_link_can_be_asked_for_within_a_limit(client_for, fresh_limits):
    amina = UserFactory(username="amina", email_verified_at=None)
    client = client_for(amina)
    assert client.post(reverse("email-verify-resend")).status_code == 302
    assert client.post(reverse("email-verify-resend")).status_code == 302
    limited = client.post(reverse("email-verify-resend"))
    assert limited.status_code == 429 and int(limited["Retry-After"]) > 0
    assert len(mail.outbox) == 2
    client.get(link_in(mail.outbox[1]))
    amina.refresh_from_db()
    assert amina.email_verified


def test_the_join_page_says_why_it_cannot_make_a_token(client_for):
    run = RunFactory(slug="bangla")
    amina = UserFactory(username="amina", email_verified_at=None)
    client = client_for(amina)
    assert 'id="token-blocked"' in client.get(reverse("run-join", args=[run.slug])).content.decode()
    assert client.post(reverse("run-join", args=[run.slug]), {"action": "token"}).status_code == 403
    assert not AgentToken.objects.exists()


def test_a_closed_deployment_can_turn_the_requirement_off(client_for, settings):
    settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED = False
    client = Client()
    client.post(reverse("signup"), SIGN_UP)
    assert mail.outbox == []
    assert client.post(reverse("tokens"), NEW_TOKEN).status_code == 200
    assert AgentToken.objects.filter(user__username="amina").exists()


def test_the_mail_speaks_the_language_the_volunteer_signed_up_in():
    client = Client()
    client.cookies["django_language"] = "bn"
    client.post(reverse("signup"), SIGN_UP)
    message = mail.outbox[0]
    assert "ই-মেইল" in message.subject and "Confirm" not in message.body and "Open this link" not in message.body
    assert 'lang="bn"' in message.alternatives[0][0]
    client.post(signup_link_in(message))
    assert User.objects.get(username="amina").language == "bn"


@pytest.mark.django_db(transaction=True)
def test_accounts_made_before_verification_existed_count_as_verified():
    """The migration's decision (docs/volunteers.md): existing volunteers keep creating tokens."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("accounts", "0002_initial")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old_user = executor.loader.project_state(before).apps.get_model("accounts", "User")
    old_user.objects.create(username="early", email="early@example.org", pseudonym="volunteer-early")
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    early = User.objects.get(username="early")
    assert early.email_verified_at == early.date_joined


def test_changing_the_address_over_and_over_cannot_mail_strangers_in_bulk(client_for, fresh_limits):
    amina = UserFactory(username="amina")
    client = client_for(amina)
    statuses = [client.post(reverse("profile"), {"email": f"stranger{n}@example.org", "visibility": "public"}).status_code
                for n in range(3)]
    assert statuses == [302, 302, 429]
    assert [m.to for m in mail.outbox] == [["stranger0@example.org"], ["stranger1@example.org"]]
    amina.refresh_from_db()
    assert amina.email == "stranger1@example.org"
