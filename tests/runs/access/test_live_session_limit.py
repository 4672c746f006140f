"""The live sessions per volunteer are counted in the database, for every web process at once, and two
joins at once cannot both take a volunteer's last place (runs/access/sessions.py)."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from accounts.services import token_create
from peer_agent.protocol import JoinRequest
from runs.access.rules import JoinRefused
from runs.access.sessions import session_open
from runs.models import TrainingSession
from tests.factories import RunFactory, join_body


def lock_waits() -> int:
    """How many other backends wait for a row lock now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_two_joins_at_once_cannot_both_take_a_volunteers_last_place(volunteer, settings):
    """The first join holds its transaction open after it counted; the second, as another web
    process's would, counts only once the first has stored its session, and is refused."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite lets one writing transaction in at a time: two joins cannot overlap there")
    settings.VOLUNTEER_MAX_LIVE_SESSIONS = 1
    run = RunFactory(slug="bengali-albert")
    tokens = [token_create(user=volunteer, name=name)[0] for name in ("laptop", "desktop")]
    counted, commit = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def join(name: str, token, hold: bool) -> None:
        try:
            with transaction.atomic():
                session, _ = session_open(run=run, token=token, request=JoinRequest.model_validate(join_body(run.slug)))
                if hold:
                    counted.set()
                    assert commit.wait(60)
            outcomes[name] = session
        except JoinRefused as refusal:
            outcomes[name] = refusal.code
        finally:
            connections.close_all()

    first = threading.Thread(target=join, args=("first", tokens[0], True))
    first.start()
    assert counted.wait(60)
    second = threading.Thread(target=join, args=("second", tokens[1], False))
    second.start()
    deadline = time.monotonic() + 60
    while not lock_waits() and second.is_alive():  # it waits for the first's lock, or (without one) it is through
        assert time.monotonic() < deadline, "the second join neither waited nor ended"
        time.sleep(0.05)
    commit.set()
    for thread in (first, second):
        thread.join(timeout=60)
    assert isinstance(outcomes["first"], TrainingSession)
    assert outcomes["second"] == "too_many_sessions"
    assert TrainingSession.objects.filter(user=volunteer).count() == 1
