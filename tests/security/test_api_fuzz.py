"""Schemathesis fuzzes every operation of the served OpenAPI schema, in process, as vik with a
valid agent token: no 5xx, every documented response matches its schema, and every refusal has
the API's error shape."""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

EXAMPLES_PER_OPERATION = 25  # about 11 operations: the whole fuzz stays well under a minute


# Loaded from the app itself at collection: the schema it serves is the schema tested.
SCHEMA = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


def _takes_invalid_input(operation) -> bool:
    """Whether some input can be invalid: a body, a token, or a parameter other than free text."""
    raw = operation.definition.raw
    schemas = [parameter.get("schema", {}) for parameter in raw.get("parameters", [])]
    constrained = [schema for schema in schemas if set(schema) - {"type", "title"} or schema.get("type") != "string"]
    return bool(constrained) or "requestBody" in raw or "security" in raw


NEGATABLE = [operation for operation in OPERATIONS if _takes_invalid_input(operation)]


def error_shape(ctx, response, case) -> None:
    """A 4xx is `{"error": {"code": str, "detail": str}}`, so an agent can always say why."""
    if 400 <= response.status_code < 500:
        error = response.json().get("error")
        if not (isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("detail"), str)):
            raise AssertionError(f"{response.status_code} without the error shape: {response.text[:300]}")


def _aim_at_real_objects(case, values: dict) -> None:
    """Half the generated slugs and session ids are swapped for real ones, so that the fuzz
    reaches the code behind the lookups instead of stopping at 404."""
    params = case.path_parameters or {}
    if isinstance(params.get("slug"), str) and len(params["slug"]) % 2 == 0:
        params["slug"] = values["public"]
    if isinstance(params.get("session_id"), int) and params["session_id"] % 2 == 0:
        params["session_id"] = values["public_session"]


@pytest.fixture(autouse=True)
def _keep_the_test_transaction():
    """As Django's test client does: the WSGI handler's end-of-request hook would close the test's
    database connection, in the middle of its transaction (PostgreSQL)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _fuzz(operation, world, mode: GenerationMode, checks: list) -> None:
    # Schemathesis' own pytest plugin does not load on pytest 9; Hypothesis drives the cases here.
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION, deadline=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck), database=None,
    )
    def fuzz(case):
        _aim_at_real_objects(case, world.values)
        case.call_and_validate(headers={"Authorization": f"Bearer {world.tokens['vik']}"}, checks=checks)

    fuzz()


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda operation: operation.label)
def test_valid_requests_never_fail_and_get_answers_that_keep_to_the_schema(world, operation):
    _fuzz(operation, world, GenerationMode.POSITIVE,
          [not_a_server_error, response_schema_conformance, content_type_conformance, error_shape])


@pytest.mark.parametrize("operation", NEGATABLE, ids=lambda operation: operation.label)
def test_invalid_requests_get_a_4xx_with_a_reason(world, operation):
    _fuzz(operation, world, GenerationMode.NEGATIVE, [not_a_server_error, error_shape])
