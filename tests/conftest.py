"""The named people every permission test speaks of, and clients logged in as them."""

import logging

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.test import Client

from tests import rsa_keys
from tests.factories import UserFactory

# pytest-django's fixtures that reach the database (directly, or through a server of the portal).
DATABASE_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                     "live_server", "client", "admin_client", "django_user_model"}
# Modules whose tests reach the database or Redis without those fixtures: they start the portal's own
# processes, or use its cache or broker, which follow DATABASE_URL and REDIS_URL.
SERVER_MODULES = ("tests/portal/test_api.py", "tests/portal/test_broker.py", "tests/portal/test_settings.py",
                  "tests/portal/test_web_tier.py", "tests/runs/swarm/test_coordinator_signals.py",
                  "tests/security/test_client_address.py", "tests/security/test_rate_limits.py",
                  "tests/test_backup_restore.py", "tests/test_docs_commands.py", "tests/test_process_stops.py",
                  "tests/harness/test_netlab.py")
# Modules whose code under test takes a path of its own on SQLite: the series' epoch seconds
# (runs/swarm/series.py) and the ingest's database thread (runs/ingest/reports.py).
SQLITE_PATH_MODULES = ("tests/runs/api/test_series_api.py", "tests/runs/ingest/test_agent_socket.py",
                       "tests/runs/ingest/test_ingest_rules.py")


def pytest_configure(config) -> None:
    rsa.generate_private_key = rsa_keys.generate_private_key  # run authorities' and peers' keys, in this process


def pytest_collection_modifyitems(items) -> None:
    """Mark each test for the passes of .ci/run that run it, so that a test runs twice only where its
    outcome can differ between the embedded defaults and PostgreSQL with Redis.

    ``backend_free``: reaches neither the database nor Redis; run once, on the embedded defaults.
    ``both_backends``: starts the portal's processes, uses its cache or broker, or tests a SQLite path;
    run on both. The other tests reach the database through pytest-django: run once, on PostgreSQL,
    the database of a real deployment; the embedded defaults' own run is the demo's
    (tests/test_demo.py), which trains on SQLite end to end.
    """
    for item in items:
        if item.nodeid.startswith(SERVER_MODULES + SQLITE_PATH_MODULES):
            item.add_marker(pytest.mark.both_backends)
        elif not (item.get_closest_marker("django_db") or DATABASE_FIXTURES & set(item.fixturenames)):
            item.add_marker(pytest.mark.backend_free)


@pytest.fixture
def organizer(db):
    return UserFactory(username="olga", organizer=True)


@pytest.fixture
def volunteer(db):
    return UserFactory(username="vik")


@pytest.fixture
def outsider(db):
    return UserFactory(username="oscar")


@pytest.fixture
def staff(db):
    return UserFactory(username="stella", is_staff=True, is_superuser=True)


@pytest.fixture
def client_for(db):
    """`client_for(user)` is a test client logged in as that user (None: anonymous)."""

    def make(user) -> Client:
        client = Client()
        if user is not None:
            client.force_login(user)
        return client

    return make


@pytest.fixture(autouse=True)
def _celery_runs_tasks_inline(settings, tmp_path):
    """Tasks run in the test's process and transaction; media files go to a temporary folder."""
    from portal.celery import app

    app.conf.task_always_eager = True
    settings.MEDIA_ROOT = tmp_path / "media"
    # Deliberately slow hashing protects real passwords; the tests' users need none of it.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield
    app.conf.task_always_eager = False


@pytest.fixture(autouse=True)
def _rate_limits_out_of_the_way(settings):
    """Tests post forms many times from one address; tests of a limit (tests/security) set their own."""
    settings.RATE_LIMITS = {name: (1_000_000, window) for name, (_, window) in settings.RATE_LIMITS.items()}


@pytest.fixture
def asgi_server(transactional_db):
    """The real ASGI application (HTTP and websockets) served by uvicorn on a free loopback port,
    in a thread of the test process so that it shares the test database. Yields its URL."""
    import socket
    import threading
    import time

    import uvicorn

    from portal.asgi import application

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def credit_beat(settings):
    """What Celery beat does for a live portal: the credit rollup every second, in a thread, so that
    leaderboards fill while real agents report."""
    import threading

    from django.db import connection

    from runs.credit.rollup import credit_rollup

    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 0
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(1.0):
                try:
                    credit_rollup()
                except Exception:  # as beat does: a failed pass (a locked database) is retried next time
                    logging.getLogger(__name__).exception("credit rollup failed; retrying")
        finally:
            connection.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


@pytest.fixture
def coordinator(settings, tmp_path):
    """A coordinator whose cycles the test runs itself, in the main thread (the checkpointer starts
    hivemind processes, which set signal handlers). Between them a thread keeps its backbone peers'
    heartbeats going, as `serve` does, so that joins keep naming them while they are up."""
    import threading
    from contextlib import suppress

    from django.db import connection

    from runs.swarm.coordinator import Coordinator

    settings.COORDINATOR_STATE_DIR = str(tmp_path / "coordinator")
    coordinator = Coordinator(interval=1.0)
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(1.0):
                for peer in list(coordinator.peers.values()):
                    try:
                        peer.heartbeat()
                    except Exception:  # a locked SQLite table, a peer being shut down: the next beat makes up for it
                        logging.getLogger(__name__).debug("heartbeat failed", exc_info=True)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield coordinator
    stop.set()
    thread.join(timeout=30)
    for peer in coordinator.peers.values():
        with suppress(Exception):
            peer.shutdown()

