"""Every long-running portal process (web, Celery worker with beat, beat alone, validator worker, coordinator) stops
within 10 s of SIGTERM, as `docker compose stop` and Ctrl-C ask it to, and with LOG_FORMAT=json
writes every log record as one JSON line; the web's lines carry the request id that its answer
names."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from harness.processes import children_reap
from runs.management.commands.demo import coordinator_command, validator_command, web_command, worker_command
from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
STOP_WITHIN_S = 10
# What a record looks like in the plain format (portal/settings.py): none may be left in JSON mode.
PLAIN_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


@pytest.fixture(scope="module")
def portal_env(tmp_path_factory) -> dict:
    """A migrated portal of its own on the embedded defaults, logging JSON, with one active run."""
    env = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(PORTAL_VAR_DIR=str(tmp_path_factory.mktemp("var")), LOG_FORMAT="json", C_FORCE_ROOT="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "shell", "-c",
                    # Its tokenizer still training: the checkpointer waits, and the coordinator serves the backbone peer.
                    "from tests.factories import RunFactory; RunFactory(slug='stop-run', initial_peers=[], "
                    "tokenizer_status='training')"],
                   cwd=ROOT, env=env, check=True)
    return env


class Started:
    """A process of the portal, its output gathered line by line."""

    def __init__(self, command: list[str], env: dict) -> None:
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n{self.output()}"
            time.sleep(0.2)

    def stop(self) -> float:
        """SIGTERM to the process alone, as Docker sends it to a container's first process, then the
        seconds until it is gone."""
        asked = time.monotonic()
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        return time.monotonic() - asked

    def records(self) -> list[dict]:
        """The JSON log records; every line that looks like a record must be one."""
        records = []
        for line in self.lines:
            assert not PLAIN_RECORD.match(line), f"a plain log line in JSON mode: {line!r}"
            if line.startswith("{"):
                record = json.loads(line)
                assert {"timestamp", "level", "logger", "message", "request_id", "run", "session_id"} <= set(record), line
                records.append(record)
        return records

    def output(self) -> str:
        return "".join(self.lines)[-6000:]


@pytest.fixture
def started():
    processes: list[Started] = []
    yield lambda command, env: processes.append(Started(command, env)) or processes[-1]
    for process in processes:
        if process.process.poll() is None:
            os.killpg(process.process.pid, signal.SIGKILL)
    children_reap()


def test_the_web_server_with_an_open_viewer_socket_stops_within_10_s_and_logs_json_with_request_ids(portal_env, started):
    port = free_port()
    web = started(web_command("127.0.0.1", port) + ["--log-level", "info"], portal_env)
    web.wait_for("Application startup complete")
    url = f"http://127.0.0.1:{port}"
    answer = httpx.get(f"{url}/api/v1/me", headers={"Authorization": "Bearer not-a-token", "X-Request-ID": "volunteer-42"})
    assert answer.status_code == 401
    assert answer.headers["X-Request-ID"] == answer.json()["error"]["request_id"] == "volunteer-42"
    drawn = httpx.get(f"{url}/api/v1/runs/no-such-run/")
    assert drawn.json()["error"]["request_id"] == drawn.headers["X-Request-ID"] and len(drawn.headers["X-Request-ID"]) == 32
    with connect(f"ws://127.0.0.1:{port}/ws/runs/stop-run/live/", origin=url, open_timeout=30) as viewer:
        viewer.recv(timeout=30)  # the board's first snapshot: the socket is open and served
        assert web.stop() < STOP_WITHIN_S, web.output()
    records = web.records()
    refused = [record for record in records if record["logger"] == "accounts.services"]
    assert refused and refused[0]["request_id"] == "volunteer-42" and "token_malformed" in refused[0]["message"], records
    assert any(record["logger"].startswith("uvicorn") for record in records), records


def test_the_celery_worker_with_beat_stops_within_10_s_and_logs_json(portal_env, started):
    worker = started(worker_command() + ["--loglevel", "INFO"], portal_env)
    worker.wait_for("ready.")
    worker.wait_for("credit-rollup")  # beat has sent its first task
    assert worker.stop() < STOP_WITHIN_S, worker.output()
    loggers = {record["logger"] for record in worker.records()}
    assert {"celery.beat", "celery.apps.worker"} <= loggers, worker.output()


def test_beat_alone_stops_within_10_s_and_logs_json(portal_env, started, tmp_path):
    beat = started([sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO",
                    "--schedule", str(tmp_path / "beat-schedule")], portal_env)
    beat.wait_for("beat: Starting")
    assert beat.stop() < STOP_WITHIN_S, beat.output()
    assert any(record["logger"] == "celery.beat" for record in beat.records()), beat.output()



def test_a_validator_worker_in_the_middle_of_a_check_stops_within_10_s_and_hands_the_check_back(portal_env, started,
                                                                                                  tmp_path):
    env = {**portal_env, "PORTAL_VAR_DIR": str(tmp_path / "var")}  # a portal of its own: its run stays apart
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
    queued = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                             "from tests.runs.swarm.validation import long_check_queue; print(long_check_queue())"],
                            cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    commitment = int(queued.stdout.split()[-1])
    validator = started(validator_command(loglevel="INFO"), env)
    validator.wait_for("spot_check_task[")  # received: the check replays a stream it will not finish
    time.sleep(2)
    assert validator.stop() < STOP_WITHIN_S, validator.output()
    assert any("goes back to the coordinator" in record["message"] for record in validator.records()), validator.output()
    left = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                           "from runs.models import StepCommitment; "
                           f"print(StepCommitment.objects.values_list('outcome', 'queued_at').get(pk={commitment}))"],
                          cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    assert left.stdout.splitlines()[-1] == "('pending', None)", "pending, and queued again by the coordinator's next cycle"


@pytest.mark.swarm
def test_the_coordinator_stops_its_backbone_peer_within_10_s_and_logs_json_with_the_run(portal_env, started):
    coordinator = started(coordinator_command() + ["--interval", "1"], portal_env)
    coordinator.wait_for("backbone peer", timeout=180)
    time.sleep(2)  # a cycle or two: heartbeats, the monitor's polls
    assert coordinator.stop() < STOP_WITHIN_S, coordinator.output()
    records = coordinator.records()
    assert any(record["run"] == "stop-run" and "backbone peer" in record["message"] for record in records), records
    assert records[-1]["message"] == "coordinator stopped", coordinator.output()


@pytest.mark.swarm
# Past the suite's 300 s: a portal of its own (migrate, a run with a trained tokenizer), up to 240 s for
# the aggregator and up to 60 s for the stop, each waited on in turn.
@pytest.mark.timeout(600)
def test_the_coordinator_stops_its_backbone_peers_aggregator_within_10_s(portal_env, started, tmp_path):
    env = {**portal_env, "PORTAL_VAR_DIR": str(tmp_path / "var")}  # a portal of its own: the other runs stay apart
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "shell", "-c",
                    "from runs.models import Run; from tests.e2e.agents import small_run; "
                    "from tests.factories import UserFactory; run = small_run(UserFactory(username='olga')); "
                    "config = run.config; config['averaging']['backbone_aggregates'] = True; "
                    "Run.objects.filter(pk=run.pk).update(config=config)"],
                   cwd=ROOT, env=env, check=True)
    coordinator = started(coordinator_command() + ["--interval", "1"], env)
    coordinator.wait_for("joins the gradient rounds beside backbone peer", timeout=240)
    assert coordinator.stop() < STOP_WITHIN_S, coordinator.output()
    messages = [record["message"] for record in coordinator.records()]
    assert any("stops, after 0 gradient rounds" in message for message in messages), coordinator.output()
    # Not always the last record: at exit asyncio may still log a pending task of hivemind's as it collects it.
    assert "coordinator stopped" in messages, coordinator.output()
