"""The bandwidth probes: bytes an agent times downloading and uploading, for agent tokens only."""

import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.services import token_create, token_revoke
from runs.api.routes import PROBE_DOWNLOAD_DEFAULT, PROBE_DOWNLOAD_MAX, PROBE_UPLOAD_MAX

DOWNLOAD = "/api/v1/probe/download"
UPLOAD = "/api/v1/probe/upload"


@pytest.fixture
def token_and_secret(volunteer):
    return token_create(user=volunteer, name="laptop")


@pytest.fixture
def auth(token_and_secret):
    return {"HTTP_AUTHORIZATION": f"Bearer {token_and_secret[1]}"}


def upload(client, body: bytes, **headers):
    return client.post(UPLOAD, data=body, content_type="application/octet-stream", **headers)


def error_code(response) -> str:
    assert response["Content-Type"] == "application/json", response.content
    return response.json()["error"]["code"]


@pytest.mark.parametrize("size", [1, 1000, PROBE_DOWNLOAD_MAX])
def test_the_download_probe_sends_exactly_the_bytes_asked_for(client, auth, size):
    response = client.get(DOWNLOAD, {"size": size}, **auth)
    assert response.status_code == 200
    assert len(response.content) == size and response["Content-Length"] == str(size)
    assert response["Cache-Control"] == "no-store"
    assert response["Content-Type"] == "application/octet-stream"


def test_the_download_probe_sends_4_mib_by_default_that_do_not_compress(client, auth):
    response = client.get(DOWNLOAD, **auth)
    assert len(response.content) == PROBE_DOWNLOAD_DEFAULT == 4 << 20
    assert len(zlib.compress(response.content[: 1 << 20])) > 0.99 * (1 << 20)


@pytest.mark.parametrize("size", ["0", "-5", str(PROBE_DOWNLOAD_MAX + 1), "lots"])
def test_a_download_size_out_of_range_or_not_a_number_is_a_400(client, auth, size):
    response = client.get(DOWNLOAD, {"size": size}, **auth)
    assert response.status_code == 400
    assert error_code(response) in {"invalid_size", "invalid_request"}


@pytest.mark.parametrize("size", [0, 1, 100_000, PROBE_UPLOAD_MAX])
def test_the_upload_probe_counts_the_bytes_it_received(client, auth, size):
    response = upload(client, b"\xa5" * size, **auth)
    assert response.status_code == 200
    assert response.json() == {"bytes": size}


@pytest.mark.parametrize("size", [PROBE_UPLOAD_MAX + 1, 3 << 20])  # below and above DATA_UPLOAD_MAX_MEMORY_SIZE
def test_an_upload_over_2_mib_is_a_413_in_the_api_error_shape(client, auth, size):
    response = upload(client, b"\0" * size, **auth)
    assert response.status_code == 413
    assert error_code(response) == "probe_too_large"
    assert str(PROBE_UPLOAD_MAX) in response.json()["error"]["detail"]


@pytest.mark.parametrize(("method", "path"), [("get", DOWNLOAD), ("post", UPLOAD)])
def test_the_probes_need_an_agent_token(client, db, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 401
    assert error_code(response) == "token_missing"
    bad = getattr(client, method)(path, HTTP_AUTHORIZATION="Bearer dlp_not-a-real-token")
    assert bad.status_code == 401


@pytest.mark.parametrize(("method", "path"), [("get", DOWNLOAD), ("post", UPLOAD)])
def test_a_revoked_token_cannot_use_the_probes(client, auth, token_and_secret, method, path):
    token_revoke(token=token_and_secret[0])
    response = getattr(client, method)(path, **auth)
    assert (response.status_code, error_code(response)) == (401, "token_revoked")


def test_a_logged_in_browser_without_a_token_cannot_use_the_probes(client_for, volunteer):
    browser = client_for(volunteer)
    assert browser.get(DOWNLOAD).status_code == 401
    assert upload(browser, b"x").status_code == 401


def test_the_probes_are_documented_in_the_openapi_schema(client, db):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert "/api/v1/probe/download" in paths and "/api/v1/probe/upload" in paths


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(size=st.text(max_size=40))
def test_any_download_size_is_answered_with_bytes_or_a_json_4xx(client, auth, size):
    response = client.get(DOWNLOAD, {"size": size}, **auth)
    if response.status_code != 200:
        assert response.status_code == 400 and error_code(response) in {"invalid_size", "invalid_request"}


@FUZZ
@given(
    body=st.binary(max_size=2000),
    content_type=st.sampled_from(["application/json", "text/plain", "multipart/form-data",
                                  "application/x-www-form-urlencoded", ""]),
)
def test_any_upload_body_is_counted_never_parsed(client, auth, body, content_type):
    response = client.generic("POST", UPLOAD, data=body, content_type=content_type, **auth)
    assert (response.status_code, response.json()) == (200, {"bytes": len(body)})
