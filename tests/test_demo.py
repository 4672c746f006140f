"""The README's first command as a newcomer meets it: `make demo` runs `python manage.py demo` on the
embedded defaults, and within minutes two volunteers train and fill the live leaderboard and the
coordinator saves a checkpoint; Ctrl-C stops every process it started."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from runs.management.commands.demo import ORGANIZER, RUN_SLUG, VOLUNTEERS
from tests.processes import children_reap

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def leaderboard(url: str) -> list[dict]:
    try:
        answer = httpx.get(f"{url}/api/v1/runs/{RUN_SLUG}/leaderboard", timeout=10)
    except httpx.HTTPError:
        return []  # not serving yet
    return answer.json() if answer.status_code == 200 else []


def test_the_demo_trains_two_volunteers_live_checkpoints_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The embedded defaults, whatever the suite itself runs on.
    env = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(PORTAL_VAR_DIR=str(tmp_path / "var"), DEMO_PORT=str(port))
    log_path = tmp_path / "demo.log"
    with open(log_path, "wb") as log:
        demo = subprocess.Popen([sys.executable, "manage.py", "demo"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 480
        rows: list[dict] = []
        while not (len(rows) == 2 and all(row["samples"] > 0 for row in rows)):
            tail = log_path.read_text(errors="replace")[-4000:]
            assert demo.poll() is None, tail
            assert time.monotonic() < deadline, f"two volunteers never trained: {rows}\n{tail}"
            time.sleep(3)
            rows = leaderboard(url)
        assert {row["name"] for row in rows} == {name for name, _ in VOLUNTEERS[:2]}
        first = {row["name"]: row["samples"] for row in rows}
        while not all(row["samples"] > first[row["name"]] for row in rows):  # still rising
            assert time.monotonic() < deadline, f"samples stopped rising: {rows}"
            time.sleep(3)
            rows = leaderboard(url)
        assert httpx.get(f"{url}/runs/{RUN_SLUG}/", timeout=10).status_code == 200
        while not httpx.get(f"{url}/api/v1/runs/{RUN_SLUG}/checkpoints", timeout=10).json():
            assert time.monotonic() < deadline, "no checkpoint appeared\n" + log_path.read_text(errors="replace")[-4000:]
            time.sleep(3)

        banner = log_path.read_text(errors="replace")
        assert f"{url}/runs/{RUN_SLUG}/" in banner and repr(ORGANIZER[1]) in banner
        assert all(repr(password) in banner for _, password in VOLUNTEERS[:2])

        started = psutil.Process(demo.pid).children(recursive=True)
        assert len(started) >= 5, "web, worker, coordinator and two agents"
        demo.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the command in the foreground
        assert demo.wait(timeout=180) == 0, log_path.read_text(errors="replace")[-4000:]
        assert "demo stopped." in log_path.read_text(errors="replace")
        _, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, f"left running: {[(process.pid, process.name()) for process in alive]}"
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for process in started:
            if process.is_running():
                process.kill()
        children_reap()
