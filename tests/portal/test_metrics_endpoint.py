"""``GET /metrics``: only for the scrape token or the allowed networks; counts every process's
HTTP requests by route and status and Celery tasks by name, and adds up several processes' counters."""

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from portal.scrape import metrics_registry
from tests.scrape import TOKEN, Scrape, scrape

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def error_code(response) -> str:
    return json.loads(response.content)["error"]["code"]


def test_metrics_are_refused_without_the_token_and_with_a_wrong_one(settings):
    settings.METRICS_TOKEN = TOKEN
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer not-the-token"}, {"HTTP_AUTHORIZATION": TOKEN}):
        response = Client().get("/metrics", **headers)
        assert response.status_code == 401 and error_code(response) == "not_authenticated"
        assert response["WWW-Authenticate"] == "Bearer"
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert b"# TYPE dedloc_reports_accepted_total counter" in response.content


def test_metrics_are_served_to_the_allowed_networks_only(settings):
    settings.METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    for address in ("192.168.1.5", "", "unix:/run/portal.sock"):
        refused = Client(REMOTE_ADDR=address).get("/metrics")
        assert refused.status_code == 403 and error_code(refused) == "forbidden"


def test_with_neither_a_token_nor_networks_nobody_reads_the_metrics(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_NETWORKS = "", []
    response = Client().get("/metrics")
    assert response.status_code == 403 and error_code(response) == "metrics_off"


def test_http_requests_are_counted_by_route_pattern_and_status_never_by_path(settings, organizer, client_for):
    before = scrape(settings)
    client_for(organizer).get("/runs/no-such-run/")
    Client().get("/no/such/page/")
    after = scrape(settings)
    assert after.increase(before, "dedloc_http_requests_total", route="runs/<slug:slug>/", method="GET", status="404") == 1
    assert after.increase(before, "dedloc_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert not any("no-such" in str(labels) for _, labels in after.samples)
    assert after.increase(before, "dedloc_http_request_duration_seconds_count", route="runs/<slug:slug>/") == 1


def test_celery_task_runs_and_failures_are_counted_by_task(settings):
    from portal.celery import app
    from runs.setup.services import tokenizer_train_task
    from runs.tasks import credit_rollup_task

    before = scrape(settings)
    credit_rollup_task.apply()
    # As a worker does: the failure is recorded (and signalled), not raised into the caller.
    app.conf.task_eager_propagates = False
    try:
        assert tokenizer_train_task.apply(args=[987654]).failed()  # no such run
    finally:
        app.conf.task_eager_propagates = True
    after = scrape(settings)
    for task, failures in ((credit_rollup_task.name, 0), (tokenizer_train_task.name, 1)):
        assert after.increase(before, "dedloc_celery_task_runs_total", task=task) == 1
        assert after.increase(before, "dedloc_celery_task_failures_total", task=task) == failures


COUNT_IN_A_PROCESS = """
import sys
from portal.metrics import AGENT_SOCKETS_OPEN, REPORTS_ACCEPTED
REPORTS_ACCEPTED.inc(int(sys.argv[1]))
AGENT_SOCKETS_OPEN.inc()
"""


def test_several_processes_counters_are_added_up_in_one_view(tmp_path, monkeypatch):
    # As uvicorn and Celery workers do: each process writes its values in PROMETHEUS_MULTIPROC_DIR.
    for reports in (3, 4):
        subprocess.run([sys.executable, "-c", COUNT_IN_A_PROCESS, str(reports)], cwd=ROOT, check=True, timeout=60,
                       env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    from prometheus_client import generate_latest

    view = Scrape(generate_latest(metrics_registry()).decode())
    assert view.value("dedloc_reports_accepted_total") == 7
    # Sockets count only for processes alive now: both have exited.
    assert view.value("dedloc_agent_sockets_open") == 0
