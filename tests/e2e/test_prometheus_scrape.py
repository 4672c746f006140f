"""A real Prometheus (Debian's `prometheus`) scrapes a running portal on loopback: after a few reports,
its own HTTP API has the run's metrics with the right values, and it has loaded the alerting rules."""

import datetime
import json
import math
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from websockets.sync.client import connect

from accounts.services import token_create
from runs.models import RunSample, TrainingSession
from tests.agent_wire import report
from tests.factories import RunFactory

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "prometheus-scrape-token"
REPORTS = 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path, asgi_server):
    """Prometheus scraping ``asgi_server``'s /metrics every second with the token; yields its API's URL."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
        "scrape_configs": [{
            "job_name": "dedloc-portal",
            "authorization": {"credentials": TOKEN},
            "static_configs": [{"targets": [asgi_server.removeprefix("http://")]}],
        }],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address={address}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    url = f"http://{address}"
    try:
        until(lambda: _ready(url), what="Prometheus to start", log=tmp_path / "prometheus.log")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def until(check, *, what: str, log: Path | None = None, timeout: float = 60):
    """Poll ``check`` until it returns a true value, and return it."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}" + (f":\n{log.read_text()}" if log else "")
        time.sleep(0.25)
    return result


def query(prometheus: str, promql: str) -> float | None:
    """The value of a single-series PromQL query now, through Prometheus's HTTP API; None if no series."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    results = answer["data"]["result"]
    assert len(results) <= 1, results
    return float(results[0]["value"][1]) if results else None


@pytest.mark.django_db(transaction=True)
def test_prometheus_scrapes_the_run_s_metrics_with_the_right_values(settings, asgi_server, prometheus, volunteer):
    settings.METRICS_TOKEN = TOKEN
    run = RunFactory(slug="scraped-run")
    RunSample.objects.create(run=run, global_epoch=12, samples_per_second=48.0, alive_peers=2, loss=3.5)
    token, secret = token_create(user=volunteer, name="laptop")
    session = TrainingSession.objects.create(run=run, user=volunteer, token=token, peer_public_key="ssh-rsa AAAA",
                                             agent_version="0.1.0", access_expires_at=datetime.datetime.now(datetime.UTC))

    assert until(lambda: query(prometheus, 'up{job="dedloc-portal"}') == 1, what="a first scrape")
    accepted = query(prometheus, "dedloc_reports_accepted_total")  # this process's count so far: exposed from 0
    refused = query(prometheus, 'dedloc_reports_refused_total{code="bad_json"}') or 0.0

    agent_socket = asgi_server.replace("http", "ws") + "/ws/agent/"
    with connect(agent_socket, additional_headers={"Authorization": f"Bearer {secret}"}) as agent:
        for seq in range(1, REPORTS + 1):
            agent.send(json.dumps(report(session.pk, seq)))
            assert json.loads(agent.recv(timeout=10)) == {"type": "ack", "seq": seq}
        agent.send("not json")
        assert json.loads(agent.recv(timeout=10))["code"] == "bad_json"

    until(lambda: query(prometheus, "dedloc_reports_accepted_total") == accepted + REPORTS, what=f"{REPORTS} more reports")
    until(lambda: query(prometheus, 'dedloc_reports_refused_total{code="bad_json"}') == refused + 1, what="the refused frame")
    # Polled too: on a busy host a scrape can pass its timeout (the 1 s interval), and its series go
    # stale until the next scrape that succeeds.
    until(lambda: query(prometheus, 'dedloc_run_alive_peers{run="scraped-run"}') == 2, what="2 alive peers")
    until(lambda: query(prometheus, 'dedloc_run_global_epoch{run="scraped-run"}') == 12, what="global epoch 12")
    until(lambda: (query(prometheus, 'dedloc_run_coordinator_heartbeat_age_seconds{run="scraped-run"}') or math.inf) < 300,
          what="a heartbeat younger than 300 s")
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert "DedlocCoordinatorSilent" in {rule["name"] for group in rules for rule in group["rules"]}
