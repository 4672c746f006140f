"""The demo's portal for a bench (bench/liar.py, bench/soak.py): Django set up on a var dir of its own
(SQLite, media), migrated, the demo's organizer, volunteers and run made, and the commands of the three
services ``manage.py demo`` starts. The bench starts and stops the processes its own way."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class DemoLab:
    var_dir: Path
    logs: Path  # the services' and agents' logs
    url: str  # the web server's
    organizer: Any
    volunteers: list  # the demo's volunteers, each to run an agent
    run: Any
    services: list[tuple[str, list[str], Path]]  # (name, command, log) of the web server, worker and coordinator


def demo_lab(*, var_dir: str | None, prefix: str, volunteers: int, port: int,
             run_ensure: Callable[..., Any] | None = None) -> DemoLab:
    """Set up the demo's portal in ``var_dir`` (a new temporary one named ``prefix`` when None), with the demo's
    run, or the run ``run_ensure(organizer=...)`` makes (bench/rehearsal.py's, of another preset and data)."""
    var = Path(var_dir or tempfile.mkdtemp(prefix=prefix))
    os.environ["PORTAL_VAR_DIR"] = str(var)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from runs.management.commands.demo import (
        coordinator_command,
        demo_people_ensure,
        demo_run_ensure,
        web_command,
        worker_command,
    )

    call_command("migrate", verbosity=0)
    organizer, people = demo_people_ensure(volunteers)
    run = run_ensure(organizer=organizer) if run_ensure else demo_run_ensure(organizer=organizer, preset="demo")
    logs = var / "logs"
    logs.mkdir(exist_ok=True)
    services = [("web", web_command("127.0.0.1", port), logs / "web.log"),
                ("worker", worker_command(), logs / "worker.log"),
                ("coordinator", coordinator_command(), logs / "coordinator.log")]
    return DemoLab(var_dir=var, logs=logs, url=f"http://127.0.0.1:{port}", organizer=organizer, volunteers=people,
                   run=run, services=services)


def process_start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    """One of the lab's processes, in a process group of its own (an agent's hivemind children with it)."""
    with log.open("ab") as file:
        return subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=file, stderr=subprocess.STDOUT,
                                start_new_session=True)


def process_stop(process: subprocess.Popen, timeout: float = 120) -> None:
    """SIGINT to the process's group, as a volunteer's Ctrl-C (an agent finishes its step and flushes its reports),
    then SIGKILL to whatever of the group is left. The group is signalled even when its leader is gone: an agent
    the kernel killed for memory leaves its DHT, averagers and p2p daemon running, out of its parent's reach."""
    if process.poll() is None:
        _group_signal(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    group_kill(process.pid)
    process.wait()


def group_members(group: int) -> list[psutil.Process]:
    """The live processes of process group ``group`` (zombies, which hold nothing, left out)."""
    members = []
    for candidate in psutil.process_iter():
        with suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(candidate.pid) == group and candidate.status() != psutil.STATUS_ZOMBIE:
                members.append(candidate)
    return members


def group_kill(group: int, grace: float = 10.0) -> None:
    """Let the processes of ``group`` end on their own for up to ``grace`` seconds, then SIGKILL those left."""
    deadline = time.monotonic() + grace
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    _group_signal(group, signal.SIGKILL)
    psutil.wait_procs(group_members(group), timeout=5)


def _group_signal(group: int, signum: int) -> None:
    with suppress(ProcessLookupError):  # the whole group is gone already
        os.killpg(group, signum)


def services_stop(services: list[subprocess.Popen]) -> None:
    """SIGTERM to the web server, worker and coordinator together; SIGKILL to any still running a minute later,
    and to what is left of their groups."""
    for process in services:
        if process.poll() is None:
            _group_signal(process.pid, signal.SIGTERM)
    for process in services:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _group_signal(process.pid, signal.SIGKILL)
            process.wait()
        group_kill(process.pid)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def percentile(values: list[float], percent: int) -> float | None:
    """The ``percent``-th percentile of ``values``, None when there are none (a bench's lags, its round times)."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f}"
