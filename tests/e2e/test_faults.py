"""Two real agents train and report while, in turn, the web server is killed and started again,
PostgreSQL crashes and restarts, Redis is killed and restarted, and the coordinator is killed and
restarted. Afterwards no agent crashed, every report each agent spooled was acked and is stored
exactly once, and the live page (one viewer that stayed connected since the web restart, and a new
one) shows the run's confirmed totals as the last rollup left them.

The test owns every server it restarts: its own PostgreSQL (initdb into a temporary folder) and
redis-server on free loopback ports, the portal as a uvicorn subprocess, the coordinator as
`manage.py run_coordinator`. It reads the results with psycopg, so it runs the same in both CI
passes (embedded defaults and real servers). No Celery worker is needed: nothing on the report path
queues a task, and the one credit rollup the live totals need is run here, as beat would run it.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from websockets.sync.client import ClientConnection, connect

from harness.processes import children_reap
from peer_agent.spool import SpoolSummary, spool_files, spool_read
from tests.e2e.agents import ROOT, agent, wait_for
from tests.processes import RedisServer, restartable_port

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]


def _postgres_bin() -> Path:
    """The newest installed PostgreSQL's programs (Debian's `postgresql` package, as `.ci/run` installs)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda path: int(path.parent.name))
    if not versions or not shutil.which("redis-server"):
        pytest.fail("this test starts its own PostgreSQL and Redis: install Debian's postgresql and redis-server")
    return versions[-1]

VOLUNTEERS = ("amina", "rahim")
SLUG = "e2e-run"  # tests.e2e.agents.small_run

# Run inside `manage.py shell` against the test's own database: its tables, the organizer, the run the
# other e2e tests use, and an agent token for each volunteer (printed for the test to read).
PREPARE = f"""
import json
from django.core.management import call_command
call_command("migrate", verbosity=0)
from accounts.services import token_create
from tests.e2e.agents import small_run
from tests.factories import UserFactory
small_run(UserFactory(username="olga", organizer=True))
secrets = {{name: token_create(user=UserFactory(username=name), name="e2e")[1] for name in {VOLUNTEERS!r}}}
print("SECRETS", json.dumps(secrets))
"""
ROLLUP = "from runs.credit.rollup import credit_rollup; credit_rollup()"


def as_postgres(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user then (as .ci/run does)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class Postgres:
    """A PostgreSQL server of the test's own, in a folder the postgres user may write."""

    def __init__(self, work: Path) -> None:
        self.work, self.data, self.port = work, work / "data", restartable_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/portal"

    def create(self) -> None:
        subprocess.run(as_postgres([str(_postgres_bin() / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]),
                       check=True, capture_output=True, timeout=120)
        self.start()
        with psycopg.connect(self.url.replace("/portal", "/postgres"), autocommit=True) as connection:
            connection.execute("CREATE DATABASE portal")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.work} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-l", str(self.work / "server.log"), "-w", "-t", "120", "-o", options, "start")

    def crash(self) -> None:
        """Stop as a power cut would: no checkpoint, every connection cut; the next start recovers from the WAL."""
        self._ctl("-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        with suppress(subprocess.SubprocessError):
            self._ctl("-m", "immediate", "-w", "stop")

    def _ctl(self, *args: str) -> None:
        subprocess.run(as_postgres([str(_postgres_bin() / "pg_ctl"), "-D", str(self.data), *args]),
                       check=True, capture_output=True, timeout=150)

    def rows(self, query: str, *params) -> list[tuple]:
        # A connection per query: the server restarts under the test.
        with psycopg.connect(self.url, connect_timeout=10) as connection:
            return connection.execute(query, params).fetchall()


class Service:
    """A portal process (the web server, the coordinator) started on the test's servers, killable."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.command, self.env, self.log = name, command, env, logs / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def kill(self) -> None:
        """SIGKILL to the process and everything it started (the coordinator's hivemind processes)."""
        family = [self.process, *psutil.Process(self.process.pid).children(recursive=True)]
        for process in family:
            with suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.kill()
        self.process.wait()
        psutil.wait_procs([p for p in family[1:] if isinstance(p, psutil.Process)], timeout=10)

    def assert_alive(self) -> None:
        assert self.process.poll() is None, f"{self.name} exited: {self.log.read_text()[-3000:]}"


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"manage.py {' '.join(args)}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result.stdout


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def readiness(portal: str) -> tuple[int, set[str]]:
    """The status of ``/readyz`` and the names of what it says is down."""
    try:
        response = httpx.get(portal + "/readyz", timeout=10)
    except httpx.HTTPError:
        return 0, set()
    return response.status_code, set(response.json().get("problems", {}))


def live_viewer(portal: str) -> ClientConnection:
    ws = portal.replace("http://", "ws://")
    # A browser route: the Origin is checked. The test reads the snapshots only now and then: an
    # unbounded queue keeps the client reading (and answering pings) in between, as a browser does.
    return connect(f"{ws}/ws/runs/{SLUG}/live/", origin=portal, open_timeout=30, max_queue=None)


def snapshot_until(viewer: ClientConnection, condition, timeout: float, what: str) -> dict:
    """The first snapshot the viewer receives that satisfies ``condition`` (the live page sends one
    when the run's snapshot changes)."""
    seen = []
    try:
        while True:
            snapshot = json.loads(viewer.recv(timeout=timeout))
            seen.append(snapshot.get("totals"))
            if condition(snapshot):
                return snapshot
    except TimeoutError:
        pytest.fail(f"no live snapshot with {what}; totals seen: {seen[-5:]}")


def test_agents_train_through_restarts_of_every_server_and_each_report_counts_once(tmp_path):
    began = time.monotonic()

    def phase(what: str) -> None:  # the timeline, shown with a failure's report (or with -s)
        print(f"{time.monotonic() - began:6.1f} s  {what}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="dedloc-faults-"))
    work.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(work, "postgres")
    postgres, cache = Postgres(work), RedisServer(work)
    homes = {name: tmp_path / name for name in VOLUNTEERS}
    agents: dict[str, subprocess.Popen] = {}
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        cleanup.callback(postgres.stop)
        postgres.create()
        cleanup.callback(lambda: cache.process and cache.kill())
        cache.start()
        env = {
            **os.environ, "DATABASE_URL": postgres.url, "REDIS_URL": cache.url, "PORTAL_VAR_DIR": str(tmp_path / "var"),
            "MEDIA_ROOT": str(tmp_path / "media"), "COORDINATOR_STATE_DIR": str(tmp_path / "coordinator"),
            "CREDIT_ROLLUP_SETTLE_SECONDS": "0", "LOG_LEVEL": "WARNING",
        }
        secrets = json.loads(manage(env, "shell", "-c", PREPARE).split("SECRETS ", 1)[1])
        port = restartable_port()
        portal = f"http://127.0.0.1:{port}"
        web = Service("web", [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1",
                              "--port", str(port), "--log-level", "warning"], env, tmp_path)
        coordinator = Service("coordinator", [sys.executable, "manage.py", "run_coordinator", "--run", SLUG,
                                              "--interval", "1"], env, tmp_path)

        def services_reap() -> None:
            for service in (web, coordinator):
                if service.process is not None and service.process.poll() is None:
                    service.kill()
            for process in agents.values():
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
            children_reap()

        cleanup.callback(services_reap)

        def db_now():
            return postgres.rows("SELECT now()")[0][0]

        def heartbeat_after(moment) -> bool:
            return bool(postgres.rows("SELECT 1 FROM runs_run WHERE slug = %s AND coordinator_heartbeat_at > %s", SLUG, moment))

        started = db_now()
        web.start()
        coordinator.start()
        wait_for(lambda: answers(portal + "/"), 120, "the web server")
        wait_for(lambda: heartbeat_after(started), 120, "the coordinator's backbone peer")
        phase("servers, portal and coordinator up")
        for name in VOLUNTEERS:
            agents[name] = agent(portal, secrets[name], homes[name], "600s")

        def last_event_id() -> int:
            return postgres.rows("SELECT coalesce(max(id), 0) FROM runs_contributionevent")[0][0]

        def stored_after(event_id: int) -> set[str]:
            """The volunteers with a report stored after event ``event_id``."""
            return {name for (name,) in postgres.rows(
                "SELECT DISTINCT u.username FROM runs_contributionevent e JOIN runs_trainingsession s ON s.id = e.session_id"
                " JOIN accounts_user u ON u.id = s.user_id WHERE e.id > %s", event_id)}

        def last_seqs() -> dict[str, int]:
            return {name: max((spool_read(path)[1].last_seq for path in spool_files(homes[name] / "spool")), default=0)
                    for name in VOLUNTEERS}

        def all_alive() -> None:
            for name, process in agents.items():
                assert process.poll() is None, f"agent {name} exited: {(tmp_path / f'{name}.log').read_text()[-3000:]}"
            web.assert_alive()
            coordinator.assert_alive()

        def through_fault(what: str, stop, start, down: str | None = None) -> None:
            """Stop a server, hold it down until both agents have spooled a report made meanwhile (so
            that they report into the outage), start it again and wait until both agents' reports
            are stored again. ``down`` names what the web server's /readyz must say is down meanwhile."""
            all_alive()
            phase(what)
            stop()
            if down is not None:
                wait_for(lambda: readiness(portal) == (503, {down}), 30, f"/readyz to say the {down} is down")
            before = last_seqs()
            wait_for(lambda: all(seq > before[name] for name, seq in last_seqs().items()), 60,
                     f"both agents to report while {what}")
            phase("  both agents reported meanwhile; starting it again")
            start()
            mark = last_event_id()
            wait_for(lambda: stored_after(mark) == set(VOLUNTEERS), 120, f"reports of both agents stored after {what}")
            phase("  reports of both agents stored again")
            wait_for(lambda: readiness(portal) == (200, set()), 30, "/readyz to say the portal is ready again")
            all_alive()

        wait_for(lambda: stored_after(0) == set(VOLUNTEERS), 240, "both agents to train and report")
        phase("both agents train and report")

        def web_start() -> None:
            web.start()
            wait_for(lambda: answers(portal + "/"), 120, "the restarted web server")

        through_fault("the web server was killed", web.kill, web_start)
        # A viewer of the live page from now on stays connected through the remaining faults.
        viewer = cleanup.enter_context(live_viewer(portal))
        snapshot_until(viewer, lambda snapshot: snapshot["type"] == "snapshot", 30, "the first snapshot")
        through_fault("PostgreSQL was down", postgres.crash, postgres.start, down="database")
        through_fault("Redis was down", cache.kill, cache.start, down="redis")
        restarted = []

        def coordinator_start() -> None:
            restarted.append(db_now())
            coordinator.start()
            wait_for(lambda: heartbeat_after(restarted[0]), 120, "the restarted coordinator's heartbeat")

        through_fault("the coordinator was killed", coordinator.kill, coordinator_start)

        phase("stopping the agents")
        # Stop the agents as a volunteer does (Ctrl-C): they finish the step, send the last reports, leave.
        for process in agents.values():
            os.kill(process.pid, signal.SIGINT)
        for name, process in agents.items():
            assert process.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

        summaries = {name: [spool_read(path)[1] for path in spool_files(homes[name] / "spool")] for name in VOLUNTEERS}
        for name, sessions in summaries.items():
            assert len(sessions) == 1, f"{name}'s agent kept its one session through every fault"
            assert_counted_exactly_once(postgres, sessions[0])
        acked = sum(summary.acked_samples for sessions in summaries.values() for summary in sessions)
        stored = postgres.rows("SELECT count(*), coalesce(sum(samples), 0) FROM runs_contributionevent")[0]
        assert stored == (sum(s.acked_reports for sessions in summaries.values() for s in sessions), acked)

        # What Celery beat does every few seconds: roll the stored reports up into the run's credit,
        # which counts what the coordinator confirmed (the last epochs may still wait for it).
        manage(env, "shell", "-c", ROLLUP)
        confirmed = postgres.rows("SELECT coalesce(sum(samples_verified), 0), count(*) FROM runs_runcredit"
                                  " WHERE samples_verified > 0")[0]
        want = {"samples": confirmed[0], "volunteers": confirmed[1]}
        assert confirmed[0] <= acked, (confirmed, acked)

        def with_every_report(snapshot: dict) -> bool:
            return {key: snapshot["totals"][key] for key in want} == want

        snapshot_until(viewer, with_every_report, 30, f"totals {want} on the viewer connected through the faults")
        with live_viewer(portal) as fresh:
            snapshot = snapshot_until(fresh, with_every_report, 30, f"totals {want} on a new viewer")
        on_board = {name for (name,) in postgres.rows(
            "SELECT u.username FROM runs_runcredit c JOIN accounts_user u ON u.id = c.user_id WHERE c.samples_verified > 0")}
        assert {row["name"] for row in snapshot["leaderboard"]} == on_board
        web.assert_alive()
        coordinator.assert_alive()
        # Through a database restart too, the agent socket answers "try again later" (server_error), never crashes.
        assert "Exception in ASGI application" not in web.log.read_text(), "the web server logged an unhandled exception"
        phase("done")


def assert_counted_exactly_once(postgres: Postgres, summary: SpoolSummary) -> None:
    """Nothing pending in the agent's spool, and the portal holds exactly the reports it acked."""
    assert summary.pending == {}, f"session {summary.session_id}: reports still pending"
    refused = postgres.rows("SELECT seq, code, detail FROM runs_reportrejection WHERE session_id = %s", summary.session_id)
    assert summary.dropped_reports == 0, f"session {summary.session_id}: the portal refused reports: {refused}"
    count, samples = postgres.rows(
        "SELECT count(*), coalesce(sum(samples), 0) FROM runs_contributionevent WHERE session_id = %s", summary.session_id)[0]
    assert count == summary.acked_reports == summary.last_seq
    assert samples == summary.acked_samples
