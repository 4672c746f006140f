"""Arbitrary input to sign-up and to the token-authenticated API never produces a 500."""

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
text = st.text(max_size=300)


@FUZZ
@given(username=text, email=text, password1=text, password2=text)
def test_sign_up_with_arbitrary_fields_never_errors(db, username, email, password1, password2):
    response = Client().post(
        "/accounts/signup/", {"username": username, "email": email, "password1": password1, "password2": password2}
    )
    assert response.status_code in {200, 302}


@FUZZ
@given(header=st.text(max_size=200).filter(lambda value: "\n" not in value and "\r" not in value))
def test_the_api_refuses_arbitrary_authorization_headers_in_json(db, header):
    response = Client().get("/api/v1/me", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["error"]["code"].startswith("token_")


@FUZZ
@given(
    body=st.binary(max_size=2000),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "multipart/form-data", "application/x-www-form-urlencoded", ""]),
    method=st.sampled_from(["get", "post", "put", "patch", "delete"]),
)
def test_the_api_answers_arbitrary_bodies_with_a_4xx(db, body, content_type, method):
    response = Client().generic(method.upper(), "/api/v1/me", data=body, content_type=content_type, HTTP_AUTHORIZATION="Bearer x")
    assert 400 <= response.status_code < 500


@pytest.mark.parametrize("size", [1_000_000, 5_000_000])
def test_a_huge_body_is_refused_not_crashed_on(db, size):
    response = Client().post("/accounts/signup/", data=b"x" * size, content_type="application/x-www-form-urlencoded")
    assert response.status_code in {200, 400, 413}
