"""The JSON API: documented by a served OpenAPI schema, answering every error in one JSON shape."""

import asyncio

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def test_the_openapi_schema_is_served_and_documents_the_endpoints(client, db):
    schema = client.get("/api/v1/openapi.json").json()
    assert schema["info"]["title"] == "DeDLOC Portal API"
    assert "/api/v1/me" in schema["paths"]
    assert client.get("/api/v1/docs").status_code == 200


def test_an_unknown_api_path_answers_json_not_html(client, db):
    response = client.get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_wrong_method_is_a_4xx(client, db):
    response = client.post("/api/v1/me")
    assert 400 <= response.status_code < 500


def test_the_channel_layer_delivers_between_consumers():
    # With REDIS_URL set this goes through Redis, the path between web processes in production.
    async def roundtrip() -> dict:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add("test-group", channel)
        await layer.group_send("test-group", {"type": "ping", "n": 1})
        message = await asyncio.wait_for(layer.receive(channel), timeout=5)
        await layer.group_discard("test-group", channel)
        return message

    assert async_to_sync(roundtrip)() == {"type": "ping", "n": 1}


def test_a_database_outage_is_a_503_with_retry_after_not_a_500(client, db, monkeypatch):
    from django.db import OperationalError

    from runs.api import routes

    def away(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(routes, "run_list_public", away)
    response = client.get("/api/v1/runs/")
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert response.json()["error"]["code"] == "unavailable"
