"""Request ids and the log context (portal/logs.py): every answer names its request, API errors say
it in their body, and log records made while serving carry it."""

import logging

import pytest

from portal.logs import LogContext, json_formatter, log_context


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(LogContext())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    handler = Records()
    logging.getLogger().addHandler(handler)
    yield handler.records
    logging.getLogger().removeHandler(handler)


def test_an_api_error_names_the_request_id_its_header_and_log_lines_carry(client, db, records):
    answer = client.get("/api/v1/me", headers={"Authorization": "Bearer dlp_guess"})
    request_id = answer.headers["X-Request-ID"]
    assert answer.status_code == 401 and answer.json()["error"]["request_id"] == request_id
    refused = [record for record in records if record.name == "accounts.services"]
    assert refused and {record.request_id for record in refused} == {request_id}


@pytest.mark.parametrize("offered, kept", [
    ("3f2c9d0e8b7a4c55a1e0f6b2d4c8e913", True),  # nginx's $request_id
    ("volunteer-42.retry:2", True),
    ("two words", False),
    ("forged\", \"level\": \"CRITICAL", False),
    ("x" * 129, False),
])
def test_a_clients_request_id_is_kept_only_when_it_is_a_plain_token(client, db, offered, kept):
    answer = client.get("/api/v1/runs/no-such-run/", headers={"X-Request-ID": offered})
    assert (answer.headers["X-Request-ID"] == offered) is kept
    assert answer.json()["error"]["request_id"] == answer.headers["X-Request-ID"]


def test_pages_carry_a_request_id_too(client, db):
    assert len(client.get("/").headers["X-Request-ID"]) == 32


def test_the_context_stamps_records_made_inside_it_and_is_gone_after(records):
    logger = logging.getLogger("tests.logs")
    with log_context(run="bengali-albert"), log_context(session_id=7):
        logger.warning("inside")
    logger.warning("after")
    inside, after = records[-2:]
    assert (inside.run, inside.session_id, after.run, after.session_id) == ("bengali-albert", 7, None, None)
    line = json_formatter().format(inside)
    assert '"run": "bengali-albert"' in line and '"session_id": 7' in line and '"logger": "tests.logs"' in line
