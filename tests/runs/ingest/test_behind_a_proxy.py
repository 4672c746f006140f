"""Two web processes of the portal behind a real nginx that runs deploy/nginx/portal.conf, both on the
test's PostgreSQL and Redis (issue #35): pages and websockets pass through it, a token's agent
sockets are counted across both processes, a killed process's sockets stop counting once their
leases lapse, and a viewer on one process sees a report that landed on the other.

Each process is a uvicorn subprocess on the test database (pytest-django's, committed by
``transactional_db``); which one holds a socket is read from its own ``/metrics`` (no
PROMETHEUS_MULTIPROC_DIR: each process counts only its own sockets). CI runs this once, in its pass
on PostgreSQL and Redis; on the embedded defaults it is skipped, as subprocesses cannot reach
SQLite's in-memory test database.
"""

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from contextlib import ExitStack, suppress
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from runs.management.commands.demo import web_command
from tests.agent_wire import report
from tests.processes import free_port
from tests.scrape import TOKEN, Scrape

ROOT = Path(__file__).resolve().parents[3]
ROUTES = ROOT / "deploy" / "nginx" / "portal.conf"
LIMIT = 16  # AGENT_TOKEN_MAX_SOCKETS's default
LEASE_SECONDS = 6
# The rest of an nginx.conf around the routes: as the current user, in the test's folder, in the
# foreground as a child of the test; one worker, so that it hands connections to the processes in turn.
NGINX_CONF = """
daemon off;
worker_processes 1;
{user}
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log {work}/access.log;
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    upstream portal_web {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        include {routes};
    }}
}}
"""


def wait_for(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


class WebProcess:
    """``uvicorn portal.asgi:application`` on a port of its own, as each of a deployment's web processes."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / f"web-{self.port}.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(web_command("127.0.0.1", self.port), cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def metrics(self) -> Scrape:
        answer = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert answer.status_code == 200, answer.text
        return Scrape(answer.text)

    def sockets(self, kind: str = "agent") -> int:
        return int(self.metrics().value(f"dedloc_{kind}_sockets_open"))

    def kill(self) -> None:
        """SIGKILL: the process closes nothing and drops no lease."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


class Portal:
    """nginx on a free port in front of the web processes."""

    def __init__(self, url: str, web: list[WebProcess]) -> None:
        self.url, self.web = url, web
        self.agent_url = url.replace("http://", "ws://") + "/ws/agent/"

    def agent_sockets(self) -> list[int]:
        return [process.sockets() for process in self.web]


def nginx_start(work: Path, port: int, upstreams: list[int]) -> subprocess.Popen:
    if not shutil.which("nginx"):
        pytest.fail("this test runs nginx in front of the portal: install Debian's nginx-light")
    # As root, nginx's workers would switch to `nobody`, who may not write the test's folder.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
    servers = "\n".join(f"        server 127.0.0.1:{upstream};" for upstream in upstreams)
    (work / "nginx.conf").write_text(NGINX_CONF.format(user=user, work=work, servers=servers, port=port, routes=ROUTES))
    return subprocess.Popen(["nginx", "-p", str(work), "-c", str(work / "nginx.conf"), "-e", str(work / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


@pytest.fixture
def portal(transactional_db, tmp_path):
    """Two web processes on the test's database and Redis, agent socket leases of LEASE_SECONDS, behind nginx."""
    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        pytest.skip("two web processes share the test's database and counts: run with DATABASE_URL (PostgreSQL) "
                    "and REDIS_URL set")
    database = connection.settings_dict
    password = f":{database['PASSWORD']}" if database["PASSWORD"] else ""
    env = {
        **os.environ, "REDIS_URL": settings.REDIS_URL, "PORTAL_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": f"postgres://{database['USER']}{password}@{database['HOST']}:{database['PORT']}/{database['NAME']}",
        "MEDIA_ROOT": str(tmp_path / "media"), "METRICS_TOKEN": TOKEN, "AGENT_SOCKET_LEASE_SECONDS": str(LEASE_SECONDS),
        "LOG_LEVEL": "WARNING",
    }
    work = tmp_path / "nginx"
    work.mkdir()
    with ExitStack() as cleanup:
        web = []
        for _ in range(2):
            web.append(WebProcess(env, tmp_path))
            cleanup.callback(web[-1].kill)
        for process in web:
            wait_for(lambda process=process: answers(f"{process.url}/healthz") or process.process.poll() is not None,
                     "a web process to start")
            assert process.process.poll() is None, process.output()
        port = free_port()
        nginx = nginx_start(work, port, [process.port for process in web])
        cleanup.callback(lambda: (nginx.terminate(), nginx.wait(timeout=30)))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(f"{url}/healthz") or nginx.poll() is not None, "nginx to start")
        assert nginx.poll() is None, (work / "error.log").read_text()
        yield Portal(url, web)


def agent_socket(held: ExitStack, portal: Portal, secret: str, frame: dict,
                 url: str | None = None) -> tuple[ClientConnection, dict]:
    """An agent socket that sent one report, closed with ``held``: the socket and the first answer,
    its ack or the refusal the portal sends as it closes the socket."""
    socket = held.enter_context(connect(url or portal.agent_url, additional_headers={"Authorization": f"Bearer {secret}"},
                                        open_timeout=30))
    with suppress(ConnectionClosed):  # a refused socket may be closed by now: its refusal is still there to read
        socket.send(json.dumps(frame))
    return socket, json.loads(socket.recv(timeout=30))


def agent_socket_once_admitted(held: ExitStack, portal: Portal, secret: str, frames, timeout: float = 60) -> None:
    """An agent socket, once one is admitted: a closed socket frees its place once its process has seen it close."""
    deadline = time.monotonic() + timeout
    while True:
        with ExitStack() as attempt:
            _, answer = agent_socket(attempt, portal, secret, next(frames))
            if answer["type"] == "ack":
                held.enter_context(attempt.pop_all())
                return
        assert answer["code"] == "too_many_connections" and time.monotonic() < deadline, answer
        time.sleep(0.1)


def assert_refused(socket: ClientConnection, answer: dict) -> None:
    assert answer["code"] == "too_many_connections", answer
    with pytest.raises(ConnectionClosed) as closed:
        socket.recv(timeout=30)
    assert closed.value.rcvd.code == 4429


@pytest.mark.django_db(transaction=True)
def test_pages_and_websockets_pass_the_proxy_and_a_tokens_17th_socket_is_refused_on_either_process(portal, session):
    for page in ("/", f"/runs/{session.run.slug}/", "/readyz"):
        answer = httpx.get(portal.url + page, timeout=30)
        assert answer.status_code == 200, (page, answer.text[:500])
    seqs = iter(range(1, 1000))
    with ExitStack() as held:
        sockets = []
        for _ in range(LIMIT):
            socket, answer = agent_socket(held, portal, session.secret, report(session.pk, next(seqs)))
            assert answer["type"] == "ack", answer
            sockets.append(socket)
        spread = portal.agent_sockets()
        assert sum(spread) == LIMIT and min(spread) > 0, f"the sockets landed on both processes: {spread}"

        # Through the proxy, one after the other (it hands them to the processes in turn), and at each process.
        for url in [portal.agent_url, portal.agent_url, *(f"ws://127.0.0.1:{p.port}/ws/agent/" for p in portal.web)]:
            with ExitStack() as attempt:
                assert_refused(*agent_socket(attempt, portal, session.secret, report(session.pk, next(seqs)), url=url))

        sockets[0].close()
        agent_socket_once_admitted(held, portal, session.secret, (report(session.pk, seq) for seq in seqs))
        with ExitStack() as attempt:
            assert_refused(*agent_socket(attempt, portal, session.secret, report(session.pk, next(seqs))))
        assert sum(portal.agent_sockets()) == LIMIT


@pytest.mark.django_db(transaction=True)
def test_a_viewer_on_one_process_sees_a_report_that_landed_on_the_other(portal, session):
    ws = portal.url.replace("http://", "ws://")
    with connect(f"{ws}/ws/runs/{session.run.slug}/live/", origin=portal.url, open_timeout=30, max_queue=None) as viewer:
        assert json.loads(viewer.recv(timeout=30))["alive_peers"] == 0
        watched = wait_for(lambda: [p for p in portal.web if p.sockets("viewer")], "the viewer to be counted")[0]
        other = next(process for process in portal.web if process is not watched)
        with ExitStack() as held:
            # The proxy hands sockets to the processes in turn: the first or the second lands on the other one.
            for count in (1, 2):
                socket = held.enter_context(connect(portal.agent_url, open_timeout=30,
                                                    additional_headers={"Authorization": f"Bearer {session.secret}"}))
                wait_for(lambda count=count: sum(portal.agent_sockets()) == count, "the socket to be counted")
                if other.sockets():
                    break
            assert other.sockets() == 1, "no agent socket landed on the process the viewer is not on"
            socket.send(json.dumps(report(session.pk, 1)))
            assert json.loads(socket.recv(timeout=30))["type"] == "ack"
            deadline = time.monotonic() + 60
            while (snapshot := json.loads(viewer.recv(timeout=60)))["alive_peers"] != 1:
                assert time.monotonic() < deadline, f"the viewer never saw the report: {snapshot}"
            assert (snapshot["samples_per_second"], snapshot["pace_source"]) == (12.5, "reports")


@pytest.mark.django_db(transaction=True)
def test_a_killed_processs_sockets_stop_counting_once_their_leases_lapse(portal, session):
    seqs = iter(range(1, 1000))
    with ExitStack() as held:
        for _ in range(LIMIT):
            _, answer = agent_socket(held, portal, session.secret, report(session.pk, next(seqs)))
            assert answer["type"] == "ack", answer
        killed, alive = portal.web
        on_killed = killed.sockets()
        assert 0 < on_killed < LIMIT
        killed.kill()
        began = time.monotonic()
        # nginx now hands every socket to the live process; the killed one's places come back once their leases lapse.
        admitted, refused = [], 0
        while len(admitted) <= on_killed:
            socket, answer = agent_socket(held, portal, session.secret, report(session.pk, next(seqs)))
            if answer["type"] == "ack":
                admitted.append(time.monotonic() - began)
                continue
            assert_refused(socket, answer)
            refused += not admitted
            if len(admitted) == on_killed:
                break
            assert time.monotonic() - began < 120, f"the killed process's leases never lapsed ({len(admitted)} back)"
            time.sleep(0.2)
        print(f"the killed process's {on_killed} places came back {admitted[0]:.1f}-{admitted[-1]:.1f} s after SIGKILL "
              f"(lease {LEASE_SECONDS} s)")
        assert refused, "right after the kill its sockets still counted: their leases had not lapsed"
        assert len(admitted) == on_killed, "the killed process's places, and no more: the live one's still count"
        assert alive.sockets() == LIMIT


def test_the_nginx_lines_docs_deploy_shows_are_those_the_test_runs():
    text = (ROOT / "docs" / "deploy.md").read_text().split("## Several web processes")[1].split("\n## ")[0]
    shown = {line.strip() for block in re.findall(r"```nginx\n(.*?)```", text, re.S) for line in block.splitlines()}
    routes = {line.strip() for line in ROUTES.read_text().splitlines()}
    assert "include /srv/portal/deploy/nginx/portal.conf;" in shown
    assert {line for line in shown if line.startswith(("location", "proxy_"))} <= routes
