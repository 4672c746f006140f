"""CSRF: every state-changing browser form refuses a POST without the token; the agent API is
exempt because it authenticates by Bearer token only and never by the session cookie."""

import json

import pytest
from django.test import Client

from accounts.models import AgentToken
from runs.models import TrainingSession
from tests.factories import join_body
from tests.security.matrix import API, CSRF_EXEMPT, PAGES, PERSONAS, post_data

REFUSED = {403, 404, 405, "login", "admin-login"}


def _allowed_persona(statuses: tuple) -> str:
    """The first persona the matrix lets act on a route: the one a forged form would act as."""
    return next(persona for persona, status in zip(PERSONAS, statuses, strict=True) if status not in REFUSED)


FORM_POSTS = [
    pytest.param(path, _allowed_persona(statuses), id=path)
    for path, method, *statuses in PAGES if method == "POST" and path not in CSRF_EXEMPT
]


@pytest.mark.parametrize(("template", "persona"), FORM_POSTS)
def test_every_form_refuses_a_post_without_the_csrf_token(world, template, persona):
    client = Client(enforce_csrf_checks=True)
    if world.users[persona] is not None:
        client.force_login(world.users[persona])
    tokens_before = AgentToken.objects.count()
    response = client.post(template.format(**world.values), post_data(template))
    assert response.status_code == 403
    assert b"CSRF verification failed" in response.content
    assert AgentToken.objects.count() == tokens_before


def test_the_same_form_with_its_token_is_accepted(world):
    """The refusal above is the missing token, not the persona: with it, the post goes through."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["vik"])
    page = client.get("/tokens/")
    csrf = page.cookies["csrftoken"].value
    response = client.post("/tokens/", {**post_data("/tokens/"), "csrfmiddlewaretoken": csrf})
    assert response.status_code == 200
    assert AgentToken.objects.filter(user=world.users["vik"], name="laptop").exists()


def test_the_agent_api_needs_no_csrf_token_with_a_bearer_token(world):
    client = Client(enforce_csrf_checks=True)
    response = client.post(
        f"/api/v1/runs/{world.values['public']}/join", json.dumps(join_body(world.values["public"])),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world.tokens['vik']}",
    )
    assert response.status_code == 200, response.content


STATE_CHANGING_API = [path for path, method, *_ in API if method == "POST"]


@pytest.mark.parametrize("path", STATE_CHANGING_API)
def test_the_agent_api_does_not_take_a_session_cookie_for_a_state_change(world, path):
    """A logged-in browser (what a forged cross-site request carries) is not an agent."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["vik"])
    sessions_before = TrainingSession.objects.count()
    response = client.post(path.format(**world.values), json.dumps(join_body("any")), content_type="application/json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "token_missing"
    assert TrainingSession.objects.count() == sessions_before


@pytest.mark.parametrize("template", sorted(CSRF_EXEMPT))
def test_a_form_exempt_from_csrf_acts_on_its_signed_link_and_never_on_the_session(world, template):
    """A forged cross-site post carries the victim's cookie but not a link only their mailbox holds:
    logged in as oscar, vik's link still acts for vik alone, and oscar's settings stay as they were."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["oscar"])
    assert client.post(template.format(**world.values)).status_code == 200
    world.users["oscar"].refresh_from_db()
    world.users["vik"].refresh_from_db()
    assert world.users["oscar"].email_opt_outs == [] and world.users["vik"].email_opt_outs == ["run_paused"]
