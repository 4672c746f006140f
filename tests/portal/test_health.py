"""/healthz and /readyz: cheap, unauthenticated, answered whatever the Host and scheme; /readyz says
what is down (its 503 with the database or Redis stopped is checked in tests/e2e/test_faults.py)."""

import pytest
from django.test import override_settings

PROBE_HOSTS = ["localhost", "127.0.0.1:8000", "portal.internal"]


@pytest.mark.django_db
@pytest.mark.parametrize("host", PROBE_HOSTS)
@override_settings(ALLOWED_HOSTS=["portal.example.org"], SECURE_SSL_REDIRECT=True)
def test_probes_answer_over_plain_http_whatever_the_host(client, host):
    alive = client.get("/healthz", HTTP_HOST=host)
    ready = client.get("/readyz", HTTP_HOST=host)

    assert (alive.status_code, alive.json()) == (200, {"status": "alive"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert client.get("/", HTTP_HOST=host).status_code == 400, "other pages still check the host"


@pytest.mark.django_db
def test_readiness_checks_redis_when_it_is_configured(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # the discard port: nothing speaks Redis there

    response = client.get("/readyz")

    assert response.status_code == 503 and response["Retry-After"] == "10"
    body = response.json()
    assert body["status"] == "unavailable" and set(body["problems"]) == {"redis"}
    assert body["problems"]["redis"].startswith("Redis does not answer: ")


def test_probes_refuse_writes(client):
    assert client.post("/healthz").status_code != 200
