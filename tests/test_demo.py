"""The README's first command as a newcomer meets it: `make demo` runs `python manage.py demo` on the
embedded defaults, and within minutes two volunteers train and fill the live leaderboard and the
coordinator saves a checkpoint; Ctrl-C stops every process it started."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.processes import children_reap
from peer_agent.spool import spool_files, spool_read
from runs.management.commands.demo import ORGANIZER, RUN_SLUG, VOLUNTEERS
from tests.processes import free_port

pytestmark = [pytest.mark.swarm, pytest.mark.demo, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[1]


def leaderboard(url: str) -> list[dict]:
    try:
        answer = httpx.get(f"{url}/api/v1/runs/{RUN_SLUG}/leaderboard", timeout=10)
    except httpx.HTTPError:
        return []  # not serving yet
    return answer.json() if answer.status_code == 200 else []


def demo_start(env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "manage.py", "demo"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def said(log_path: Path) -> str:
    """The demo's output as one line: the agents' console wraps long sentences."""
    return " ".join(log_path.read_text(errors="replace").split())


def volunteers_train(url: str, demo: subprocess.Popen, log_path: Path, deadline: float, above: dict[str, int]) -> dict:
    """Wait until both volunteers' samples on the run's board rise past ``above``, then rise again
    (a stopped demo's last reports can reach the board after it started again)."""
    rows: list[dict] = []

    def past(floor: dict[str, int]) -> bool:
        return len(rows) == 2 and all(row["samples"] > floor.get(row["name"], 0) for row in rows)

    for floor in (above, None):
        floor = floor if floor is not None else {row["name"]: row["samples"] for row in rows}
        while not past(floor):
            tail = log_path.read_text(errors="replace")[-4000:]
            assert demo.poll() is None, tail
            assert time.monotonic() < deadline, f"two volunteers did not train past {floor}: {rows}\n{tail}"
            time.sleep(3)
            rows = leaderboard(url)
    assert {row["name"] for row in rows} == {name for name, _ in VOLUNTEERS[:2]}
    return {row["name"]: row["samples"] for row in rows}


def ctrl_c(demo: subprocess.Popen, log_path: Path, var: Path) -> None:
    """Ctrl-C, as a newcomer stops the demo: every process it started ends, the agents first, so that
    their last reports reach the portal while it still listens: none is left waiting on disk."""
    started = psutil.Process(demo.pid).children(recursive=True)
    assert len(started) >= 5, "web, worker, coordinator and two agents"
    demo.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the command in the foreground
    assert demo.wait(timeout=180) == 0, log_path.read_text(errors="replace")[-4000:]
    log = log_path.read_text(errors="replace")
    assert "demo stopped." in log
    # Each process stopped by itself within the time the demo gives it (an agent: 10 s and a margin).
    assert re.search(r"^agent \S+ stopped \(", log, re.MULTILINE), log[-4000:]
    assert " killed: still running after " not in log, log[-4000:]
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, f"left running: {[(process.pid, process.name()) for process in alive]}"
    for name, _ in VOLUNTEERS[:2]:
        spooled = [spool_read(path)[1] for path in spool_files(var / "demo-agents" / name / "spool")]
        assert spooled and not any(summary.pending for summary in spooled), f"{name}'s reports left on disk: {spooled}"


def ctrl_c_twice(demo: subprocess.Popen, log_path: Path) -> None:
    """Ctrl-C, and Ctrl-C again while the demo stops, as an impatient newcomer does: it stops waiting
    and kills what it started; nothing is left holding the port or the run's duties."""
    started = psutil.Process(demo.pid).children(recursive=True)
    demo.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 60
    while "stopping…" not in log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-4000:]
        time.sleep(0.2)
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=60) == 0, log_path.read_text(errors="replace")[-4000:]
    assert "demo killed: asked twice to stop." in log_path.read_text(errors="replace")
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, f"left running: {[(process.pid, process.name()) for process in alive]}"


def test_the_demo_trains_two_volunteers_live_checkpoints_stops_on_ctrl_c_and_runs_again_from_its_checkpoint(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The embedded defaults, whatever the suite itself runs on; both demos in the same folder.
    env = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "REDIS_URL", "SITE_URL"}}
    env.update(PORTAL_VAR_DIR=str(tmp_path / "var"), DEMO_PORT=str(port))
    first_log, second_log = tmp_path / "demo.log", tmp_path / "demo-again.log"
    demo = demo_start(env, first_log)
    try:
        deadline = time.monotonic() + 480
        first = volunteers_train(url, demo, first_log, deadline, above={})
        assert httpx.get(f"{url}/runs/{RUN_SLUG}/", timeout=10).status_code == 200
        while not httpx.get(f"{url}/api/v1/runs/{RUN_SLUG}/checkpoints", timeout=10).json():
            assert time.monotonic() < deadline, "no checkpoint appeared\n" + first_log.read_text(errors="replace")[-4000:]
            time.sleep(3)
        banner = first_log.read_text(errors="replace")
        assert f"{url}/runs/{RUN_SLUG}/" in banner and repr(ORGANIZER[1]) in banner
        assert all(repr(password) in banner for _, password in VOLUNTEERS[:2])
        # The e-mails printed so far (a milestone's) link to this demo, not to the default port.
        assert all(link == url for link in re.findall(r"http://127\.0\.0\.1:\d+", banner)), banner[-4000:]
        saved = [checkpoint["epoch"] for checkpoint in httpx.get(f"{url}/api/v1/runs/{RUN_SLUG}/checkpoints", timeout=10).json()]
        ctrl_c(demo, first_log, tmp_path / "var")

        # The same command again in the same checkout: the coordinator's backbone peer finds none of
        # the peers it knew and starts a fresh swarm; the agents resume from the newest checkpoint.
        demo = demo_start(env, second_log)
        deadline = time.monotonic() + 420
        # An agent's resume before the board: the first demo's last events can still be rolled up now,
        # so the board's rise alone would not show that the second demo's agents train.
        while not (resumed := [int(epoch) for epoch in re.findall(r"resumed from the run's checkpoint of epoch (\d+)",
                                                                  said(second_log))]):
            assert demo.poll() is None, second_log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "no agent resumed\n" + second_log.read_text(errors="replace")[-4000:]
            time.sleep(3)
        volunteers_train(url, demo, second_log, deadline, above=first)
        # The newest of the first demo's checkpoints (or one it saved while stopping).
        assert resumed and resumed[0] >= max(saved), f"an agent resumed from the first demo's {saved}: {resumed}"
        # The backbone peer met the gone swarm and started afresh; no agent crashed on the p2p daemon's
        # refusal (the processes' other logged errors are theirs to keep).
        assert "starting a fresh swarm" in said(second_log)
        assert "P2PDaemonError" not in said(second_log), second_log.read_text(errors="replace")[-4000:]
        ctrl_c_twice(demo, second_log)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        children_reap()

