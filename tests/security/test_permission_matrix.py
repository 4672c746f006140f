"""The permission matrix: every route of the URL conf, every method it answers, every persona,
against the policy's tables in tests/security/matrix.py (PAGES: browser routes with a session
cookie; API: the JSON API with an agent token). A route that has no row there fails
`test_every_route_has_a_row`.

Each persona's request runs in its own rolled-back transaction, so one persona's POST never
changes what the next one sees.
"""

import json

import pytest
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from tests.factories import join_body
from tests.security.matrix import API, PAGES, PERSONAS, TOKEN_PERSONAS, A, L, post_data
from tests.security.world import World


def _outcome(response) -> int | str:
    location = response.get("Location", "")
    if response.status_code == 302 and location.startswith("/accounts/login/"):
        return L
    if response.status_code == 302 and location.startswith("/admin/login/"):
        return A
    return response.status_code


def _page_request(world: World, persona: str, template: str, method: str):
    client = Client()
    if world.users[persona] is not None:
        client.force_login(world.users[persona])
    path = template.format(**world.values)
    return client.get(path) if method == "GET" else client.post(path, post_data(template))


def _api_request(world: World, persona: str, template: str, method: str):
    secret = world.tokens.get(persona)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
    path = template.format(**world.values)
    if method == "GET":
        return Client().get(path, **headers)
    route, _, query = path.partition("?")
    role = query.removeprefix("role=") or "trainer"  # a join's role travels in its body; the row names it as a query
    body = json.dumps(join_body(route.split("/")[-2], role=role)) if route.endswith("/join") else "{}"
    return Client().post(path, body, content_type="application/json", **headers)


def _outcomes(world: World, personas: list[str], template: str, method: str, request) -> dict:
    outcomes = {}
    for persona in personas:
        with transaction.atomic():
            outcomes[persona] = _outcome(request(world, persona, template, method))
            transaction.set_rollback(True)
    return outcomes


def _cases(table: list, personas: list[str]) -> list:
    return [pytest.param(path, method, dict(zip(personas, statuses, strict=True)), id=f"{method} {path}")
            for path, method, *statuses in table]


@pytest.mark.parametrize(("template", "method", "expected"), _cases(PAGES, PERSONAS))
def test_pages(world, template, method, expected):
    assert _outcomes(world, PERSONAS, template, method, _page_request) == expected


@pytest.mark.parametrize(("template", "method", "expected"), _cases(API, TOKEN_PERSONAS))
def test_api(world, template, method, expected):
    assert _outcomes(world, TOKEN_PERSONAS, template, method, _api_request) == expected


def _routes(patterns, prefix: str = ""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def test_every_route_has_a_row(world):
    """A route of the URL conf (the admin's as one) with no row in PAGES or API fails here."""
    covered = {resolve(template.format(**world.values).split("?")[0]).route for template, *_ in PAGES + API}
    missing = {
        route for route in _routes(get_resolver().url_patterns)
        if route not in covered and not (route.startswith("admin/") and "admin/" in covered)
    }
    assert not missing, f"routes with no row in the permission matrix: {sorted(missing)}"
