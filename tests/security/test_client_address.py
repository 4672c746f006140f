"""Whose address the rate limits count by: the portal reads `REMOTE_ADDR` (the websocket's
`scope["client"]`) and never a header; uvicorn fills it from `X-Forwarded-For` only for connections
from the proxy that docker-compose.yml names."""

import asyncio
import re
from pathlib import Path

import pytest
import yaml
from django.core.cache import cache
from django.urls import reverse
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from tests.factories import PASSWORD

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400
CLIENT, PROXY = "203.0.113.5", "172.18.0.1"


@pytest.fixture
def limits(settings):
    cache.clear()
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login": (3, DAY), "signup": (2, DAY)}
    yield settings.RATE_LIMITS
    cache.clear()


def test_a_forged_x_forwarded_for_does_not_escape_the_login_limit(limits, client, volunteer):
    for n in range(3):
        client.post(reverse("login"), {"username": "vik", "password": "wrong"}, REMOTE_ADDR=CLIENT,
                    HTTP_X_FORWARDED_FOR=f"10.0.0.{n}")
    refused = client.post(reverse("login"), {"username": "vik", "password": PASSWORD}, REMOTE_ADDR=CLIENT,
                          HTTP_X_FORWARDED_FOR="10.0.0.99")
    assert refused.status_code == 429


def test_a_forged_x_forwarded_for_does_not_escape_the_signup_limit(limits, client, db):
    for n in range(2):
        client.post(reverse("signup"), {"username": f"new{n}"}, REMOTE_ADDR=CLIENT, HTTP_X_FORWARDED_FOR=f"10.0.0.{n}")
    refused = client.post(reverse("signup"), {"username": "new9"}, REMOTE_ADDR=CLIENT, HTTP_X_FORWARDED_FOR="10.0.0.99")
    assert refused.status_code == 429


def compose_web() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["web"]


def forwarded_allow_ips(environ: dict[str, str]) -> str:
    """What the web service passes to uvicorn's `--forwarded-allow-ips`, after Compose's
    `${NAME:-default}` interpolation with `environ`."""
    [value] = re.findall(r"--forwarded-allow-ips '([^']*)'", compose_web()["command"])
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda name: environ.get(name[1]) or name[2], value)


def address_seen_by_the_portal(*, trusted: str, peer: str, forwarded_for: str, scope_type: str) -> str:
    """The client address uvicorn hands the portal for a connection from `peer`."""
    seen = {}

    async def portal(scope, receive, send):
        seen["client"] = scope["client"]

    scope = {"type": scope_type, "client": (peer, 50000), "headers": [(b"x-forwarded-for", forwarded_for.encode())]}
    asyncio.run(ProxyHeadersMiddleware(portal, trusted_hosts=trusted)(scope, None, None))
    return seen["client"][0]


def test_compose_names_the_proxy_for_uvicorn_and_by_default_trusts_nobody_outside_the_container():
    assert "--proxy-headers" in compose_web()["command"]
    assert forwarded_allow_ips({}) == "127.0.0.1"
    assert forwarded_allow_ips({"FORWARDED_ALLOW_IPS": PROXY}) == PROXY
    assert compose_web()["ports"] == ["127.0.0.1:8000:8000"], "only a proxy on the host reaches uvicorn"


@pytest.mark.parametrize("scope_type", ["http", "websocket"])
def test_uvicorn_takes_x_forwarded_for_only_from_the_named_proxy(scope_type):
    trusted = forwarded_allow_ips({"FORWARDED_ALLOW_IPS": PROXY})
    seen = address_seen_by_the_portal(trusted=trusted, peer=CLIENT, forwarded_for="10.0.0.1", scope_type=scope_type)
    assert seen == CLIENT, "a client's own header is ignored"
    seen = address_seen_by_the_portal(trusted=trusted, peer=PROXY, forwarded_for=f"10.0.0.1, {CLIENT}",
                                      scope_type=scope_type)
    assert seen == CLIENT, "through the proxy: the address it appended, not the one the client wrote"
    seen = address_seen_by_the_portal(trusted=forwarded_allow_ips({}), peer=PROXY, forwarded_for=CLIENT,
                                      scope_type=scope_type)
    assert seen == PROXY, "the default trusts no proxy"
