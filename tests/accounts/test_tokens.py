"""Agent tokens: shown once, stored as a hash, scoped, expiring, revocable, refused with a reason."""

import datetime
import io
import logging
import re

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from accounts.models import AgentToken
from accounts.services import AgentTokenRefused, token_authenticate, token_create, token_digest
from tests.factories import RunFactory


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def create_token_in_page(client, **fields) -> str:
    response = client.post(reverse("tokens"), {"name": "home desktop", "lifetime_days": 90, **fields})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    match = re.search(r'id="new-token-secret">(dlp_[A-Za-z0-9_-]+)<', response.content.decode())
    assert match, "the new secret is shown once on the page"
    return match.group(1)


def test_token_lifecycle_create_use_record_revoke_refuse(volunteer, client_for):
    page = client_for(volunteer)
    secret = create_token_in_page(page)
    assert secret.startswith("dlp_") and len(secret) == 47  # 32 random bytes: 256 bits

    response = page.get("/api/v1/me", **bearer(secret), REMOTE_ADDR="203.0.113.9")
    assert response.status_code == 200
    assert response.json()["username"] == "vik"
    token = AgentToken.objects.get(user=volunteer)
    assert token.last_used_at is not None
    assert token.last_used_ip == "203.0.113.9"

    listing = page.get(reverse("tokens")).content.decode()
    assert "203.0.113.9" in listing
    assert secret not in listing, "the secret is never shown again"

    assert page.post(reverse("token-revoke", args=[token.pk])).status_code == 302
    refused = page.get("/api/v1/me", **bearer(secret))
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "token_revoked"


def test_an_expired_token_is_refused(volunteer, client):
    token, secret = token_create(user=volunteer, name="laptop", lifetime=datetime.timedelta(days=1))
    AgentToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    response = client.get("/api/v1/me", **bearer(secret))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "token_expired"


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "token_missing"),
        ("Bearer", "token_missing"),
        ("Basic dXNlcjpwYXNz", "token_malformed"),
        ("Bearer not-a-token", "token_malformed"),
        ("Bearer dlp_" + "A" * 43, "token_unknown"),
        ("Bearer dlp_" + "A" * 43 + "' OR 1=1 --", "token_malformed"),
    ],
)
def test_a_bad_authorization_header_gets_a_401_that_says_why(client, db, header, code):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = client.get("/api/v1/me", **extra)
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["detail"]


def test_a_disabled_account_cannot_use_its_tokens(volunteer, client):
    _, secret = token_create(user=volunteer, name="laptop")
    volunteer.is_active = False
    volunteer.save()
    response = client.get("/api/v1/me", **bearer(secret))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "account_disabled"


def test_a_run_scoped_token_works_for_its_run_and_is_refused_for_another(volunteer):
    own_run, other_run = RunFactory(), RunFactory()
    _, secret = token_create(user=volunteer, name="lab machine", run=own_run)
    assert token_authenticate(secret=secret, ip=None, run=own_run).run == own_run
    with pytest.raises(AgentTokenRefused) as refusal:
        token_authenticate(secret=secret, ip=None, run=other_run)
    assert (refusal.value.code, refusal.value.status) == ("token_out_of_scope", 403)


def test_a_token_can_be_limited_to_one_run_in_the_page(volunteer, client_for):
    run = RunFactory(status="active")
    create_token_in_page(client_for(volunteer), run=run.pk)
    assert AgentToken.objects.get(user=volunteer).run == run


def test_nothing_stored_or_logged_can_be_turned_back_into_the_secret(volunteer, client_for, caplog):
    caplog.set_level(logging.DEBUG)
    page = client_for(volunteer)
    secret = create_token_in_page(page)
    page.get("/api/v1/me", **bearer(secret))
    page.get("/api/v1/me", **bearer(secret[:-1] + "x"))

    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert secret not in dump.getvalue()
    assert secret[4:] not in dump.getvalue()
    assert token_digest(secret) in dump.getvalue(), "only the digest is stored"
    assert secret[4:] not in caplog.text


def test_a_volunteer_cannot_revoke_someone_elses_token(volunteer, outsider, client_for):
    token, secret = token_create(user=volunteer, name="laptop")
    assert client_for(outsider).post(reverse("token-revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_last_use_is_not_rewritten_on_every_request(volunteer, client, django_assert_num_queries):
    _, secret = token_create(user=volunteer, name="laptop")
    client.get("/api/v1/me", **bearer(secret))
    # A second use within a minute from the same address reads the token and writes nothing.
    with django_assert_num_queries(1):
        client.get("/api/v1/me", **bearer(secret))
