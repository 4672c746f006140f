"""Durable reports per second over `WS /ws/agent/`, next to a bare Channels echo (the ceiling).

The portal's ASGI application runs in its own uvicorn process (as `tests/conftest.py`'s
`asgi_server` serves it, but apart, so that the clients here do not share its GIL), with one extra
route, `/ws/echo/`, a consumer that sends every frame back. N agents, each a real `websockets`
connection with its own volunteer, token and session made through the ORM, send reports in a
closed loop (the next once the previous is acknowledged, i.e. committed; each agent's first
report, which authenticates its session, is sent before the clock starts; answers received in the
window count), and then the same N
connections do the same against the echo. Printed: acknowledged reports/s, ack latency p50/p99, the
echo's messages/s and the ratio; then a check that the database holds exactly the acknowledged
reports. With `--viewers`, that many browsers (split over `--client-processes`, opened at
`--connect-rate`) watch `WS /ws/runs/{slug}/live/` while 100 agents report (`--watch-rate`) and the
credit rollup runs every `--rollup-every` seconds: snapshots delivered per second, how far apart
viewers get the same snapshot, and how long after each rollup commit that moved the run's confirmed
samples each viewer got a snapshot showing them (p50/p99/max, and the pairs never delivered).

The per-connection rate limit (5 reports/s) is lifted in the server: this measures capacity.
`--writers` compares ways of storing: `batch` (runs.ingest.reports.ReportWriter, what the portal uses),
`per_report` (a transaction per report on a pool thread), `one_thread` (a transaction per report
on Channels' single sync thread, the baseline of docs/design.md).

At thousands of sockets one client process would be the bottleneck, not the portal: with
`--client-processes K` the agents are split over K processes (spawned, each with its share of the
sockets and of the rate), which connect and authenticate, then start together; their latencies and
counts are merged. Each phase also prints what every report became (sent, acknowledged, refused,
never answered, acknowledged twice), the server's memory per idle authenticated socket (its RSS
before the agents connect and once they all have, on a fresh server), and, over the window, the
server's CPU, its event loop's lag, the writer's batches, the client processes' CPU and the
machine's; the end checks per session that every report sent is stored once. Both sides raise
their limit on open files (one per socket) to the hard limit.

    DATABASE_URL=postgres://... .venv/bin/python -m bench.ingest --agents 100 1000 --viewers 500
    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m bench.ingest --agents 10000 \
        --rate 2000 --writers batch --client-processes 4
    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m bench.ingest --agents 100 --writers batch \
        --viewers 1000 10000 --client-processes 4 --connect-rate 500 --watch-rate 100 --seconds 12
"""

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import datetime
import functools
import json
import multiprocessing
import os
import queue
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

WRITER_ENV = "BENCH_INGEST_WRITER"
CHECKS_ENV = "BENCH_INGEST_CHECKS"
# The checks that judge claims on the portal's evidence (docs/trust.md); `--checks before` serves
# the agent socket without them, the baseline of the same run.
EVIDENCE_RULES = ("local_epoch_ahead_of_swarm", "speed_beyond_device", "samples_beyond_session_budget")


# --- the server side (runs inside uvicorn) ------------------------------------------------------

def open_files_raise() -> str:
    """Raise this process's soft limit on open files to its hard limit: every socket is one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return f"open files {soft} -> {hard} (hard limit {hard})"


@dataclass
class ServerTally:
    """What the server measures of itself since `/bench/stats?reset`: the writer's batches and the lag of
    its event loop (a loop kept busy delays every ack)."""
    batches: int = 0
    reports: int = 0
    largest: int = 0
    storing: float = 0.0  # seconds in the writer's batches: insert, commit, acks
    noting: float = 0.0  # seconds updating the sessions' last_seen_at, beside the batches
    lags: list[float] = field(default_factory=list)
    since: float = field(default_factory=time.perf_counter)
    cpu: float = 0.0


def writer_timed(writer, tally_now: Callable[[], ServerTally]) -> None:
    """Time the writer's batches (runs.ingest.reports.ReportWriter) into the current tally."""
    store, sessions_note = writer._store, writer._sessions_note

    async def timed_store(batch) -> None:
        began = time.perf_counter()
        try:
            await store(batch)
        finally:
            tally = tally_now()
            tally.batches, tally.reports = tally.batches + 1, tally.reports + len(batch)
            tally.largest, tally.storing = max(tally.largest, len(batch)), tally.storing + time.perf_counter() - began

    async def timed_sessions_note(unseen) -> None:
        began = time.perf_counter()
        try:
            await sessions_note(unseen)
        finally:
            tally_now().noting += time.perf_counter() - began

    writer._store, writer._sessions_note = timed_store, timed_sessions_note


async def loop_lag_watch(tally_now: Callable[[], ServerTally]) -> None:
    while True:
        began = time.perf_counter()
        await asyncio.sleep(0.01)
        tally_now().lags.append(time.perf_counter() - began - 0.01)


def stats_application(django_asgi_app, writer):
    """Django's HTTP application plus `GET /bench/stats` (`?reset` starts a new tally): the server's RSS, open
    files, and its tally since the last reset; with ``writer`` (the portal's ReportWriter), its batches."""
    process = psutil.Process()
    tallies = [ServerTally()]
    watching: list[asyncio.Task] = []
    if writer is not None:
        writer_timed(writer, lambda: tallies[-1])

    def figures(tally: ServerTally) -> dict:
        lags = sorted(tally.lags) or [float("nan")]
        cpu = process.cpu_times()
        wall = time.perf_counter() - tally.since
        return {"rss_mb": process.memory_info().rss / 2**20, "open_files": process.num_fds(),
                "cpu": (cpu.user + cpu.system - tally.cpu) / wall, "seconds": wall,
                "batches": tally.batches, "reports": tally.reports, "largest": tally.largest,
                "storing": tally.storing, "noting": tally.noting,
                "lag_p50": lags[len(lags) // 2], "lag_p99": lags[int(len(lags) * 0.99)], "lag_max": lags[-1]}

    async def application(scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/bench/stats":
            return await django_asgi_app(scope, receive, send)
        answer = figures(tallies[-1])
        if scope["query_string"] == b"reset":
            cpu = process.cpu_times()
            tallies.append(ServerTally(cpu=cpu.user + cpu.system))
        if not watching:
            watching.append(asyncio.create_task(loop_lag_watch(lambda: tallies[-1])))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})

    return application


def commitment_refusal_before(*, report, session, pace):
    """A commitment's checks before issue 29: the signature only, without the bounds on its micro-batch,
    its steps' samples (runs.ingest.reports.commitment_refusal) and its cursors (commitment_beyond_reach)."""
    from peer_agent.protocol import commitment_message
    from runs.access.authority import peer_key_proof_verify
    from runs.ingest.reports import ReportRefused

    commitment = report.commitment
    if commitment is None:
        return None
    message = commitment_message(run_id=session.run.hivemind_run_id, session_id=session.pk, commitment=commitment)
    if not peer_key_proof_verify(peer_public_key=session.peer_public_key, message=message, proof=commitment.signature):
        return ReportRefused("invalid_commitment", "the commitment is not signed by this session's peer key")
    return None


def server_application():
    """uvicorn `--factory` target: the portal's application plus `/ws/echo/`."""
    from channels.db import database_sync_to_async
    from channels.generic.websocket import AsyncWebsocketConsumer
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.conf import settings
    from django.urls import path

    from portal.asgi import django_asgi_app
    from portal.routing import websocket_urlpatterns
    from runs.ingest import consumers, reports

    class EchoConsumer(AsyncWebsocketConsumer):
        channel_layer_alias = None  # bare, like the agent socket: no channel layer
        # Nor a hop to Channels' one sync thread per frame: with it, 10,000 echo sockets opening at once wait
        # there, unread (uvicorn reads a socket again only once its frame is handled), and uvicorn closes them
        # when their pongs stay unread for 20 s.
        dispatch = consumers.AgentConsumer.dispatch

        async def receive(self, text_data=None, bytes_data=None):
            await self.send(text_data=text_data)

    class PerReportWriter:
        def __init__(self, thread_sensitive: bool) -> None:
            self.thread_sensitive = thread_sensitive

        async def store(self, *, session_id, report, **options) -> None:  # commitments are not stored here
            event = reports.report_event(session_id=session_id, report=report)
            await database_sync_to_async(reports.report_events_store, thread_sensitive=self.thread_sensitive)(events=[event])

    if os.environ.get(CHECKS_ENV) == "before":
        reports.RULES = tuple((code, rule) for code, rule in reports.RULES if code not in EVIDENCE_RULES)
        reports._not_allowed = lambda **kwargs: frozenset()
        reports._swarm_epoch = lambda **kwargs: None
        reports.commitment_refusal = commitment_refusal_before
        reports.commitment_beyond_reach = lambda **kwargs: None
    writer = os.environ.get(WRITER_ENV, "batch")
    if writer != "batch":
        reports.report_writer = PerReportWriter(thread_sensitive=writer == "one_thread")
    consumers.REPORTS_PER_SECOND, consumers.BURST = 1e9, 1e9
    # As in production (docs/deploy.md): with DEBUG on, each database connection keeps its last 9,000 queries.
    settings.DEBUG = False
    print(f"server: {open_files_raise()}", flush=True)
    return ProtocolTypeRouter({
        "http": stats_application(django_asgi_app, reports.report_writer if writer == "batch" else None),
        "websocket": URLRouter([path("ws/echo/", EchoConsumer.as_asgi()), *websocket_urlpatterns]),
    })


def server_start(port: int, writer: str, conn_max_age: int, checks: str = "current", backlog: int = 2048) -> subprocess.Popen:
    env = {**os.environ, WRITER_ENV: writer, CHECKS_ENV: checks, "DB_CONN_MAX_AGE": str(conn_max_age)}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "bench.ingest:server_application", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log", "--lifespan", "off",
         "--backlog", str(backlog)], env=env)
    deadline = time.monotonic() + 300  # importing Django on a loaded machine takes a while
    while time.monotonic() < deadline:
        assert process.poll() is None, "uvicorn exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.2)
    process.terminate()
    raise RuntimeError("uvicorn did not start")


# --- the client side -------------------------------------------------------------------------

@dataclass
class Agent:
    secret: str
    session_id: int
    seq: int = 0
    key: object = None  # the session's peer key (hivemind's RSAPrivateKey), when its reports carry commitments
    run_id: str = ""
    epoch: int = 0  # the epoch its reports are of; each commitment closes one
    cursor: int = 0  # micro-batches drawn from its stream so far


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # of answers received inside the window
    answers: int = 0  # acks (or echoes) over the whole phase
    errors: Counter[str] = field(default_factory=Counter)
    sent: int = 0  # reports sent over the whole phase, each connection's first included
    refused: int = 0  # answered with an error frame that names the report
    doubles: int = 0  # acks of a report already acknowledged on its connection, or never sent on it
    busy: list[float] = field(default_factory=list)  # each client process's CPU over the phase, in cores
    joins: list[float] = field(default_factory=list)  # seconds from opening a connection to its first answer

    @property
    def unanswered(self) -> int:
        return self.sent - self.answers - self.refused

    def merge(self, other: "Tally") -> None:
        self.latencies += other.latencies
        self.answers, self.sent = self.answers + other.answers, self.sent + other.sent
        self.refused, self.doubles = self.refused + other.refused, self.doubles + other.doubles
        self.errors.update(other.errors)
        self.busy += other.busy
        self.joins += other.joins

    def line(self, name: str, seconds: float) -> str:
        rate = len(self.latencies) / seconds
        ordered = sorted(self.latencies) or [float("nan")]
        p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        errors = f"  errors {dict(self.errors)}" if self.errors else ""
        return f"{name:<26} {rate:9.0f} msg/s   p50 {p50 * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms{errors}"

    def counts(self) -> str:
        busy = "/".join(f"{cores:.0%}" for cores in self.busy)
        joins = sorted(self.joins) or [float("nan")]
        return (f"  {self.sent} sent, {self.answers} answered, {self.refused} refused, {self.unanswered} never answered "
                f"(lost), {self.doubles} answered twice; connection to first answer p50 {joins[len(joins) // 2]:.1f} s "
                f"p99 {joins[int(len(joins) * 0.99)]:.1f} s; client processes busy {busy} of a core")


def run_create(slug: str):
    """An active run of the `tiny` preset with its own authority key, straight through the ORM (as
    bench/leaderboard.py makes its runs): the agent socket needs no more of it."""
    from django.conf import settings

    from runs.access.authority import authority_generate
    from runs.models import Run
    from runs.setup.forms import preset_config

    public_key, private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
    return Run.objects.create(name=f"Bench {slug}", slug=slug, status=Run.Status.ACTIVE,
                              config=preset_config("tiny").model_dump(mode="json"),
                              authority_public_key=public_key, authority_private_key=private_key)


def agents_create(count: int, peer_batch_run, keyed: bool = False) -> list[Agent]:
    """Volunteers, tokens and sessions for `count` agents, each with a token of its own (so that no token
    reaches AGENT_TOKEN_MAX_SOCKETS), straight through the ORM in three bulk inserts; with ``keyed``, each
    session has a peer key of its own, as a join proves it, to sign commitments with."""
    from django.utils import timezone  # Django is set up in main()

    from accounts.models import AgentToken, User
    from accounts.services import token_new
    from runs.models import TrainingSession

    stamp = int(time.time())
    names = [f"bench-{stamp}-{i}" for i in range(count)]
    verified = timezone.now()
    users = User.objects.bulk_create([User(username=name, email=f"{name}@example.org", email_verified_at=verified)
                                      for name in names], batch_size=1000)
    tokens, secrets = zip(*(token_new(user=user, name="bench") for user in users), strict=True)
    AgentToken.objects.bulk_create(tokens, batch_size=1000)
    keys = [peer_key_new() if keyed else None for _ in users]
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    sessions = TrainingSession.objects.bulk_create([
        TrainingSession(run=peer_batch_run, user=user, token=token, agent_version="bench", access_expires_at=expires,
                        peer_public_key=key.get_public_key().to_bytes().decode() if key else "ssh-rsa AAAA")
        for user, token, key in zip(users, tokens, keys, strict=True)], batch_size=1000)
    return [Agent(secret=secret, session_id=session.pk, key=key, run_id=peer_batch_run.hivemind_run_id)
            for secret, session, key in zip(secrets, sessions, keys, strict=True)]


def peer_key_new():
    from hivemind.utils.crypto import RSAPrivateKey  # imports torch: only runs with commitments need it

    return RSAPrivateKey()


def commitment_frame(agent: Agent, micro_batch_size: int, micro_batches: int) -> dict:
    """The signed commitment an honest agent sends when its epoch closes: the ``micro_batches`` it drew
    since the last one, with fingerprints and parameters' sketches in their real sizes. Signed here, as
    the agent does: the same cost on the client in every phase."""
    from peer_agent.protocol import EpochCommitment, StepCommitment
    from peer_agent.spotcheck import commitment_sign

    sketch = base64.b64encode(bytes(64)).decode()
    steps = [StepCommitment(cursor=agent.cursor + i, samples=micro_batch_size, fingerprint=sketch,
                            parameters=sketch if i == 0 else None) for i in range(micro_batches)]
    agent.cursor += micro_batches
    commitment = EpochCommitment(epoch=agent.epoch, micro_batch_size=micro_batch_size, shuffle_buffer=1000,
                                 steps=steps, signature="AA==")
    agent.epoch += 1
    signed = commitment_sign(commitment, run_id=agent.run_id, session_id=agent.session_id, key=agent.key)
    return signed.model_dump(mode="json", exclude_none=True)


def report_frame(agent: Agent, samples: int, commitment_every: int = 0, micro_batch_size: int = 0) -> str:
    """One report of a local step; with ``commitment_every``, every that many reports the agent's epoch
    closes and the report carries the epoch's signed commitment (one micro-batch of ``micro_batch_size`` a
    report), as an honest agent's report does once an epoch."""
    agent.seq += 1
    # samples ≤ one local step: plausible at any pace (runs.ingest.reports.samples_beyond_speed). The loss
    # falls as training would, so the live page's snapshot changes with every report.
    frame = {
        "type": "report", "session_id": agent.session_id, "seq": agent.seq, "samples": samples, "steps": 1,
        "local_epoch": agent.epoch, "loss": 5.0 - agent.seq * 1e-4, "samples_per_second": 100.0,
        "sent_at": datetime.datetime.now(datetime.UTC).isoformat()}
    if commitment_every and agent.seq % commitment_every == 0:
        frame["commitment"] = commitment_frame(agent, micro_batch_size, commitment_every * samples // micro_batch_size)
        frame["local_epoch"] = agent.epoch  # the next epoch: the committed one has closed
    return json.dumps(frame)


async def drive(base: str, path: str, agents: list[Agent], frame, warmup: float, seconds: float,
                rate: float = 0.0, before_start: Callable[[], None] | None = None, connect_rate: float = 0.0) -> Tally:
    """Every agent connects (with ``connect_rate``, that many a second) and sends its first report, then
    (after ``before_start``, run in a thread) all send: in a closed loop (the next report once the previous
    is answered) or, with ``rate``, at that many reports/s in all, each agent on its own schedule whether or
    not its previous report was answered yet. Answers inside the window are timed."""
    import websockets  # the client's library: the server side of this module does without it

    tally = Tally()
    connected, start = asyncio.Event(), asyncio.Event()
    ready = 0
    opening = asyncio.Semaphore(100)

    def arrived() -> None:
        nonlocal ready
        ready += 1
        if ready == len(agents):
            connected.set()

    def closed(error: Exception) -> None:
        close = getattr(error, "rcvd", None)  # the server's close frame, if it sent one
        tally.errors[f"closed {close.code} {close.reason}".strip() if close else "closed"] += 1

    def answered(answer: dict) -> bool:
        if answer.get("type") == "error":
            tally.errors[answer["code"]] += 1
            tally.refused += answer.get("seq") is not None
            return False
        tally.answers += 1
        return True

    async def closed_loop(ws, agent: Agent, window_from: float, window_to: float) -> None:
        while (sent := time.perf_counter()) < window_to:
            tally.sent += 1
            await ws.send(frame(agent))
            answer = json.loads(await ws.recv())
            at = time.perf_counter()
            if answered(answer) and window_from <= at <= window_to:
                tally.latencies.append(at - sent)

    async def paced(ws, agent: Agent, index: int, window_from: float, window_to: float) -> None:
        interval = len(agents) / rate
        sent_at: dict[int, float] = {}
        sending = True

        async def receive() -> None:
            while sending or sent_at:
                try:
                    answer = json.loads(await ws.recv())
                except websockets.ConnectionClosed as error:
                    closed(error)  # reports in flight may be stored without an ack: an agent would resend them
                    return
                at = time.perf_counter()
                sent = sent_at.pop(answer.get("seq"), None)
                if not answered(answer):
                    continue
                if sent is None:
                    tally.doubles += 1
                elif window_from <= at <= window_to:
                    tally.latencies.append(at - sent)

        receiving = asyncio.create_task(receive())
        due = time.perf_counter() + interval * index / len(agents)  # spread the agents over one interval
        while due < window_to:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            text = frame(agent)
            sent_at[agent.seq] = time.perf_counter()
            tally.sent += 1
            await ws.send(text)
            due += interval
        sending = False
        if not sent_at:
            receiving.cancel()  # it waits for an answer that no report will bring
        try:
            await asyncio.wait_for(asyncio.gather(receiving, return_exceptions=True), timeout=60)
        except TimeoutError:
            tally.errors["no answer within 60 s"] += 1

    async def one(index: int, agent: Agent) -> None:
        if connect_rate:
            await asyncio.sleep(index / connect_rate)
        opened = time.perf_counter()
        try:
            async with opening:
                # No permessage-deflate: it would cost the echo (long frames both ways) more than an ack.
                ws = await websockets.connect(f"{base}{path}", additional_headers={"Authorization": f"Bearer {agent.secret}"},
                                              open_timeout=120, ping_interval=None, compression=None)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as error:  # a limit hit: counted, not fatal
            tally.errors[f"connect: {type(error).__name__}"] += 1
            arrived()
            return
        try:
            try:
                # The first report authenticates the session and loads its pace: done before the window.
                tally.sent += 1
                await ws.send(frame(agent))
                answered(json.loads(await ws.recv()))
                tally.joins.append(time.perf_counter() - opened)
            finally:
                arrived()
            await start.wait()
            window_from, window_to = time.perf_counter() + warmup, time.perf_counter() + warmup + seconds
            if rate:
                await paced(ws, agent, index, window_from, window_to)
            else:
                await closed_loop(ws, agent, window_from, window_to)
        except websockets.ConnectionClosed as error:
            closed(error)
        finally:
            await ws.close()

    tasks = [asyncio.create_task(one(index, agent)) for index, agent in enumerate(agents)]
    await asyncio.wait_for(connected.wait(), timeout=1200)  # 10,000 sockets on a loaded machine take minutes
    if before_start is not None:
        await asyncio.to_thread(before_start)
    start.set()
    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*tasks)
    tally.busy.append((time.process_time() - cpu) / (time.perf_counter() - began))
    return tally


def client_process(base: str, path: str, agents: list[Agent], frame, warmup: float, seconds: float, rate: float,
                   connect_rate: float, ready, go, results, index: int) -> None:
    """One of `--client-processes`: its agents connect and send their first reports, it says so on
    ``ready`` and waits for ``go``, then drives; its tally and its agents' sequence numbers and epochs go
    back on ``results``."""
    open_files_raise()

    def started() -> None:
        ready.put(index)
        go.wait()

    tally = asyncio.run(drive(base, path, agents, frame, warmup, seconds, rate, started, connect_rate))
    results.put((index, tally, [(agent.seq, agent.epoch, agent.cursor) for agent in agents]))


def drive_split(base: str, path: str, agents: list[Agent], frame, warmup: float, seconds: float, rate: float,
                processes: int, before_start: Callable[[], None] | None = None, connect_rate: float = 0.0) -> Tally:
    """`drive`, with the agents split over ``processes`` client processes (1: this one) that start together
    once every one has connected its share; the tallies merged, the agents' state brought back."""
    if processes <= 1:
        return asyncio.run(drive(base, path, agents, frame, warmup, seconds, rate, before_start, connect_rate))
    context = multiprocessing.get_context("spawn")  # a fork would share this process's database connection
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    shares = [range(first, len(agents), processes) for first in range(processes)]
    workers = [context.Process(target=client_process, daemon=True, args=(
        base, path, [agents[i] for i in share], frame, warmup, seconds, rate * len(share) / len(agents),
        connect_rate * len(share) / len(agents), ready, go, results, index)) for index, share in enumerate(shares)]
    for worker in workers:
        worker.start()

    def collect(channel) -> list:
        deadline, got = time.monotonic() + 1500, []
        while len(got) < len(workers):
            try:
                got.append(channel.get(timeout=5))
            except queue.Empty:
                failed = [worker.exitcode for worker in workers if worker.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"client processes failed ({failed}) or timed out") from None
        return got

    collect(ready)
    if before_start is not None:
        before_start()
    go.set()
    tally = Tally()
    for index, part, states in collect(results):
        tally.merge(part)
        for i, (seq, epoch, cursor) in zip(shares[index], states, strict=True):
            agents[i].seq, agents[i].epoch, agents[i].cursor = seq, epoch, cursor
    for worker in workers:
        worker.join()
    return tally


class ServerWatch:
    """The server's figures around one phase, from its `/bench/stats`: the memory per idle socket, and over
    the window its CPU, its event loop's lag and the writer's batches, with the machine's CPU."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/bench/stats"
        self.lines: list[str] = []
        self.timers: list[threading.Timer] = []

    def stats(self, reset: bool = False) -> dict:
        with urllib.request.urlopen(self.url + ("?reset" if reset else ""), timeout=60) as answer:
            return json.load(answer)

    def phase(self, count: int, warmup: float, seconds: float, memory: bool) -> Callable[[], None]:
        """What to run once ``count`` agents have connected, before they start: with ``memory``, the RSS then
        against the RSS now, before they connect; and the reads that open and close the window."""
        before = self.stats(reset=True)  # and the tally of the connections' opening starts
        self.lines, machine = [], []

        def window_open() -> None:
            self.stats(reset=True)
            machine.append(psutil.cpu_times())

        def window_close() -> None:
            self.lines.append(self.window_line(self.stats(), machine[0], psutil.cpu_times()))

        def started() -> None:
            now = self.stats()
            self.lines.append(f"  opening {count} connections: {now['seconds']:.0f} s, server {now['cpu']:.0%} of a core, "
                              f"event loop lag p99 {now['lag_p99'] * 1000:.0f} ms max {now['lag_max'] * 1000:.0f} ms")
            if memory:
                time.sleep(2)  # the last first reports' writes done: the sockets idle
                now = self.stats()
                sockets = max(now["open_files"] - before["open_files"], 1)  # those still open
                self.lines.append(f"  server RSS {before['rss_mb']:.0f} MB before, {now['rss_mb']:.0f} MB with {sockets} "
                                  f"idle authenticated sockets of {count} ({now['open_files']} open files): "
                                  f"{(now['rss_mb'] - before['rss_mb']) * 1024 / sockets:.1f} KiB per socket")
            self.timers = [threading.Timer(warmup, window_open), threading.Timer(warmup + seconds, window_close)]
            for timer in self.timers:
                timer.start()

        return started

    def report(self) -> list[str]:
        for timer in self.timers:
            timer.join()
        return self.lines

    @staticmethod
    def window_line(stats: dict, cpu_from, cpu_to) -> str:
        spent = {name: getattr(cpu_to, name) - getattr(cpu_from, name) for name in cpu_to._fields}
        idle = spent["idle"] + spent.get("iowait", 0.0)
        writer = ""
        if stats["batches"]:
            writer = (f"; writer {stats['batches']} batches of {stats['reports'] / stats['batches']:.1f} reports "
                      f"(largest {stats['largest']}), busy {stats['storing'] / stats['seconds']:.0%} of the window "
                      f"(last_seen_at beside it {stats['noting'] / stats['seconds']:.0%})")
        return (f"  window: server {stats['cpu']:.0%} of a core, event loop lag p50 {stats['lag_p50'] * 1000:.1f} ms "
                f"p99 {stats['lag_p99'] * 1000:.1f} ms max {stats['lag_max'] * 1000:.0f} ms{writer}; "
                f"machine's {os.cpu_count()} CPUs {1 - idle / sum(spent.values()):.0%} busy")


@dataclass
class ViewerTally:
    """What one client process's viewers received once told to record: per viewer, each frame's arrival on
    the machine's monotonic clock (shared by its processes), a digest of its text, and the confirmed
    samples it shows (``totals.samples``: what a rollup moves)."""
    frames: list[list[tuple[float, int, int]]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    busy: list[float] = field(default_factory=list)  # each client process's CPU while recording, in cores
    connecting: list[float] = field(default_factory=list)  # each process's seconds to open all its viewers

    def merge(self, other: "ViewerTally") -> None:
        self.frames += other.frames
        self.errors.update(other.errors)
        self.busy += other.busy
        self.connecting += other.connecting


def snapshot_spread(frames: list[list[tuple[float, int, int]]], began: float, ended: float) -> tuple[list, dict, list]:
    """The frames received in [began, ended], the first arrival of each distinct text, and how long after
    its first arrival each frame came (sorted)."""
    delivered = [(at, digest) for times in frames for at, digest, _ in times if began <= at <= ended]
    first_seen: dict[int, float] = {}
    for at, digest in delivered:
        first_seen[digest] = min(first_seen.get(digest, at), at)
    return delivered, first_seen, sorted(at - first_seen[digest] for at, digest in delivered)


def rollup_deliveries(frames: list[list[tuple[float, int, int]]], commits: list[tuple[float, int]]) -> tuple[list[float], int]:
    """For each commit of the rollup (when, the confirmed samples it left) that moved the samples, and each
    viewer: how long after the commit the viewer got the first frame showing at least those samples
    (sorted), and how many (viewer, commit) pairs never got one. The first commit is what viewers had before."""
    delays, never = [], 0
    for (_, before), (committed, samples) in zip(commits, commits[1:]):
        if samples <= before:
            continue  # nothing new to show
        for times in frames:
            seen = next((at for at, _, shown in times if shown >= samples), None)
            if seen is None:
                never += 1
            else:
                delays.append(seen - committed)
    return sorted(delays), never


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values) or [float("nan")]
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], ordered[-1]


async def view(base: str, slug: str, viewers: int, connect_rate: float, connected: Callable[[], None],
               recording: Callable[[], None], stopped: Callable[[], None]) -> ViewerTally:
    """``viewers`` browsers on the live page, opened at ``connect_rate`` a second (0: 100 handshakes at a time);
    once all are open, ``connected`` (run in a thread), then frames are recorded from when ``recording``
    returns until ``stopped`` does. Each distinct text is parsed once per process."""
    import websockets  # the client's library: the server side of this module does without it

    tally = ViewerTally(frames=[[] for _ in range(viewers)])
    shown: dict[int, int] = {}  # digest -> the confirmed samples its snapshot shows
    opening, opened = asyncio.Semaphore(100), asyncio.Event()
    record, stop = asyncio.Event(), asyncio.Event()
    ready = 0
    if not viewers:
        opened.set()

    def arrived() -> None:
        nonlocal ready
        ready += 1
        if ready == viewers:
            opened.set()

    async def viewer(index: int) -> None:
        if connect_rate:
            await asyncio.sleep(index / connect_rate)
        try:
            async with opening:
                # Browsers offer permessage-deflate, as this client does by default.
                ws = await websockets.connect(f"{base}/ws/runs/{slug}/live/", origin=base.replace("ws://", "http://"),
                                              open_timeout=120, ping_interval=None, max_size=None)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as error:  # a limit hit: counted, not fatal
            tally.errors[f"connect: {type(error).__name__}"] += 1
            return
        finally:
            arrived()
        try:
            while not stop.is_set():
                try:
                    text = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                if record.is_set():
                    digest = zlib.crc32(text.encode())
                    if digest not in shown:
                        shown[digest] = json.loads(text)["totals"]["samples"]
                    tally.frames[index].append((time.monotonic(), digest, shown[digest]))
        except websockets.ConnectionClosed as error:
            close = getattr(error, "rcvd", None)
            tally.errors[f"closed {close.code}" if close else "closed"] += 1
        finally:
            await ws.close()

    began = time.monotonic()
    tasks = [asyncio.create_task(viewer(index)) for index in range(viewers)]
    await asyncio.wait_for(opened.wait(), timeout=1200)
    tally.connecting.append(time.monotonic() - began)
    await asyncio.to_thread(connected)
    await asyncio.to_thread(recording)
    record.set()
    cpu, began = time.process_time(), time.monotonic()
    await asyncio.to_thread(stopped)
    tally.busy.append((time.process_time() - cpu) / (time.monotonic() - began))
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return tally


def viewer_process(base: str, slug: str, viewers: int, connect_rate: float, ready, go, done, results, index: int) -> None:
    """One of `--client-processes` watching: its viewers open, it says so on ``ready``, records from ``go``
    until ``done``, and sends its tally back on ``results``."""
    open_files_raise()
    tally = asyncio.run(view(base, slug, viewers, connect_rate, lambda: ready.put(index), go.wait, done.wait))
    results.put(tally)


def rollup_pass(run) -> float:
    """What the coordinator's monitor and the credit rollup do: each agent's epoch confirmed with all it
    reported (as tests/factories.py's epoch_confirm), then runs.credit.rollup.credit_rollup. Its seconds."""
    from django.db.models import Sum  # Django is set up in main()
    from django.utils import timezone

    from runs.credit.rollup import credit_rollup
    from runs.models import ContributionEvent, SessionEpoch

    began, now = time.monotonic(), timezone.now()
    reported = (ContributionEvent.objects.filter(session__run=run, local_epoch=0).values("session_id")
                .annotate(samples=Sum("samples")))
    for row in reported:
        SessionEpoch.objects.update_or_create(session_id=row["session_id"], epoch=0, defaults=dict(
            reported_samples=row["samples"], announced_samples=row["samples"], status=SessionEpoch.Status.VERIFIED,
            checked_at=now))
    credit_rollup()
    return time.monotonic() - began


@contextlib.contextmanager
def rollup_commits_stamped(run) -> Iterator[list[tuple[float, int]]]:
    """While open, each commit of the credit rollup in this process appends to ``stamps`` when it committed
    (on the machine's monotonic clock, which the client processes share) and the run's confirmed samples it
    left (the live snapshot's ``totals.samples``) to the list it yields. Every transaction of the rollup takes the watermark's
    lock (runs.credit.rollup.watermark_lock)."""
    from django.db import transaction  # Django is set up in main()
    from django.db.models import Sum

    from runs.credit import rollup
    from runs.models import RunCredit

    lock, stamps = rollup.watermark_lock, []

    def committed() -> None:
        at = time.monotonic()
        stamps.append((at, RunCredit.objects.filter(run=run).aggregate(total=Sum("samples_verified"))["total"] or 0))

    def stamped():
        row = lock()
        transaction.on_commit(committed)
        return row

    rollup.watermark_lock = stamped
    try:
        yield stamps
    finally:
        rollup.watermark_lock = lock


def rollups_run(run, every: float, stop: threading.Event) -> list[float]:
    """A rollup pass every ``every`` seconds until ``stop``, on a thread of its own; their seconds."""
    from django.db import connection  # Django is set up in main()

    took = []
    try:
        while not stop.is_set():
            took.append(rollup_pass(run))
            stop.wait(max(0.0, every - took[-1]))
        return took
    finally:
        connection.close()


def watch(base: str, run, viewers: int, agents: list[Agent], frame, seconds: float, processes: int, connect_rate: float,
          rate: float, rollup_every: float, server: "ServerWatch") -> tuple[int, list[str]]:
    """`viewers` browsers on the run's live page, split over ``processes`` client processes, while the agents
    report (at ``rate`` reports/s in all; 0: a closed loop) and the credit rollup runs every ``rollup_every``
    seconds: delivered snapshots and their spread, and how long after each rollup committed every viewer
    got a snapshot showing it."""
    context = multiprocessing.get_context("spawn")  # a fork would share this process's database connection
    ready, results, go, done = context.Queue(), context.Queue(), context.Event(), context.Event()
    shares = [len(range(first, viewers, processes)) for first in range(processes)]
    workers = [context.Process(target=viewer_process, daemon=True, args=(
        base, run.slug, share, connect_rate * share / viewers, ready, go, done, results, index))
        for index, share in enumerate(shares)]
    for worker in workers:
        worker.start()
    results_of = lambda channel: [channel.get(timeout=1500) for _ in workers]  # noqa: E731
    results_of(ready)
    stop = threading.Event()
    with rollup_commits_stamped(run) as stamps:
        rollup_pass(run)  # the earlier phases' reports confirmed before the window
        stamps[:-1] = []  # what viewers see when the window opens
        server.stats(reset=True)
        machine = psutil.cpu_times()
        go.set()
        began = time.monotonic()
        rolling = concurrent.futures.ThreadPoolExecutor(1).submit(rollups_run, run, rollup_every, stop)
        tally = asyncio.run(drive(base, "/ws/agent/", agents, frame, 0, seconds, rate))
        stop.set()
        took = percentiles(rolling.result())
        ended = time.monotonic()
    window = ServerWatch.window_line(server.stats(), machine, psutil.cpu_times())
    time.sleep(3)  # the last pass's snapshot on its way
    done.set()
    viewed = ViewerTally()
    for part in results_of(results):
        viewed.merge(part)
    for worker in workers:
        worker.join()
    delivered, first_seen, spread = snapshot_spread(viewed.frames, began, ended)
    watching = sum(1 for times in viewed.frames if times)
    reports = tally.answers / (ended - began)
    p50, p99, _ = percentiles(spread)
    delays, never = rollup_deliveries(viewed.frames, stamps)
    d50, d99, dmax = percentiles(delays)
    late = sum(1 for delay in delays if delay > 2.0)
    moved = sum(1 for (_, before), (_, samples) in zip(stamps, stamps[1:]) if samples > before)
    busy = "/".join(f"{cores:.0%}" for cores in viewed.busy)
    errors = f"; errors {dict(viewed.errors)}" if viewed.errors else ""
    return tally.answers, [
        f"{viewers} viewers ({watching} got snapshots), {len(agents)} agents sending {reports:.0f} reports/s: "
        f"{len(delivered) / (ended - began):.0f} snapshots/s delivered "
        f"({len(delivered) / (ended - began) / max(watching, 1):.2f} per viewer per s), "
        f"{len(first_seen) / (ended - began):.2f} distinct snapshots/s; same snapshot reached viewers within "
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms of the first",
        f"  rollup passes every {rollup_every:g} s (each p50 {took[0] * 1000:.0f} ms, max {took[2] * 1000:.0f} ms), "
        f"{moved} commits moved the confirmed samples; a snapshot showing a commit reached each viewer p50 {d50 * 1000:.0f} ms, "
        f"p99 {d99 * 1000:.0f} ms, max {dmax * 1000:.0f} ms after it committed; {late} (viewer, commit) pairs after "
        f"more than 2 s, {never} never (of {len(delays) + never})",
        f"  opening {viewers} viewers over {processes} client process(es): {max(viewed.connecting):.0f} s{errors}; "
        f"client processes busy {busy} of a core while recording",
        window]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1000], help="concurrent agents, one measurement each")
    parser.add_argument("--writers", default="batch,per_report,one_thread", help="storing strategies to compare")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent before the window opens")
    parser.add_argument("--rate", type=float, nargs="+", default=[0.0],
                        help="reports/s offered by all agents together, one measurement each (0: closed loop, capacity)")
    parser.add_argument("--viewers", type=int, nargs="+", default=[0],
                        help="live-page viewers to measure fan-out with, one measurement each (0: skip); split over "
                             "--client-processes and opened at --connect-rate")
    parser.add_argument("--watch-rate", type=float, default=0.0,
                        help="reports/s the 100 agents offer while viewers watch (0: a closed loop, as fast as acknowledged)")
    parser.add_argument("--rollup-every", type=float, default=2.0,
                        help="seconds between the credit rollup's passes while viewers watch")
    parser.add_argument("--conn-max-age", type=int, default=60, help="DB_CONN_MAX_AGE of the server (0: a connection per call)")
    parser.add_argument("--checks", default="current",
                        help="the agent socket's checks: current, or before (without the ones that judge claims on the "
                             "portal's evidence); with both, each figure's ratio current/before is printed")
    parser.add_argument("--commitment-every", type=int, default=0,
                        help="reports per epoch: every that many, a report carries the closed epoch's signed commitment "
                             "(0: none); `--checks before` then checks its signature only, as before issue 29")
    parser.add_argument("--client-processes", type=int, default=1,
                        help="processes the agents are split over (1: this one); one process holding thousands of sockets "
                             "measures itself, not the portal")
    parser.add_argument("--connect-rate", type=float, default=0.0,
                        help="connections opened per second in all (0: as fast as 100 handshakes at a time per process go)")
    parser.add_argument("--backlog", type=int, default=4096,
                        help="uvicorn's --backlog, the queue of connections not yet accepted (capped by net.core.somaxconn)")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django  # set up here, not at import: uvicorn and the client processes import this module too

    django.setup()
    # Models and settings once Django is set up; the client processes import none of it.
    from django.conf import settings
    from django.core.management import call_command
    from django.db.models import Count

    from runs.ingest.reports import ReportWriter
    from runs.models import ContributionEvent, StepCommitment

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    call_command("migrate", verbosity=0)
    run = run_create(f"bench-ingest-{int(time.time())}")
    training = run.config["training"]
    peer_batch = training["per_device_batch_size"] * training.get("gradient_accumulation_steps", 1)
    micro_batch_size = training["per_device_batch_size"]
    began = time.perf_counter()
    agents = agents_create(max(args.agents), run, keyed=bool(args.commitment_every))
    load = lambda: os.getloadavg()[0]  # noqa: E731
    print(f"database {engine}, channel layer {settings.CHANNEL_LAYERS['default']['BACKEND'].rsplit('.', 1)[-1]}, "
          f"{os.cpu_count()} CPUs, load {load():.2f}, window {args.seconds:g} s after {args.warmup:g} s; "
          f"{len(agents)} volunteers, tokens and sessions made in {time.perf_counter() - began:.1f} s")
    somaxconn = Path("/proc/sys/net/core/somaxconn").read_text().strip()
    print(f"limits: bench {open_files_raise()}; uvicorn --backlog {args.backlog} (net.core.somaxconn {somaxconn}); "
          f"a token of its own per agent (AGENT_TOKEN_MAX_SOCKETS {settings.AGENT_TOKEN_MAX_SOCKETS}); writer batches "
          f"of at most {ReportWriter.max_batch}; agent sockets use no channel layer; "
          f"{args.client_processes} client process(es)")
    frame = functools.partial(report_frame, samples=peer_batch, commitment_every=args.commitment_every,
                              micro_batch_size=micro_batch_size)
    acked = 0
    figures: dict[tuple[str, str, int, float], list[float]] = {}
    phases = [(checks, writer) for writer in args.writers.split(",") for checks in args.checks.split(",")]
    for index, (checks, writer) in enumerate(phases):
        port = args.port + index  # the previous server's port may still be closing
        base = f"ws://127.0.0.1:{port}"
        server = server_start(port, writer, args.conn_max_age, checks, args.backlog)
        watch_server = ServerWatch(port)
        try:
            # A few reports first: what the server loads on its first agent does not count as the sockets' memory
            # (each phase's is its RSS once its sockets are open against its RSS before they open).
            acked += asyncio.run(drive(base, "/ws/agent/", agents[:10], frame, 0, 1.0)).answers
            for count in args.agents:
                for rate in args.rate:
                    some = agents[:count]
                    ingest = drive_split(base, "/ws/agent/", some, frame, args.warmup, args.seconds, rate,
                                         args.client_processes, watch_server.phase(count, args.warmup, args.seconds, True),
                                         args.connect_rate)
                    ingest_lines = watch_server.report()
                    # The same frames, from copies: what the echo is sent is not stored, so it must not move
                    # the agents' epochs and stream cursors past what the portal holds.
                    copies = [dataclasses.replace(agent) for agent in some]
                    echo = drive_split(base, "/ws/echo/", copies, frame, args.warmup, args.seconds, rate,
                                       args.client_processes, watch_server.phase(count, args.warmup, args.seconds, False),
                                       args.connect_rate)
                    acked += ingest.answers
                    figures.setdefault((checks, writer, count, rate), []).append(len(ingest.latencies) / args.seconds)
                    ratio = len(ingest.latencies) / max(len(echo.latencies), 1)
                    offered = f", {rate:g}/s offered" if rate else ""
                    print(ingest.line(f"{writer} ({checks} checks), {count} agents{offered}", args.seconds))
                    print("\n".join([ingest.counts(), *ingest_lines]))
                    print(echo.line(f"echo, {count} agents{offered}", args.seconds)
                          + f"   ingest/echo {ratio:.2f}   load {load():.2f}")
                    print("\n".join([echo.counts(), *watch_server.report()]))
            for viewers in args.viewers if writer == "batch" else []:
                if viewers:
                    print(f"load {load():.2f} before {viewers} viewers")
                    answers, lines = watch(base, run, viewers, agents[:100], frame, args.seconds, args.client_processes,
                                           args.connect_rate, args.watch_rate, args.rollup_every, watch_server)
                    acked += answers
                    print("\n".join([*lines, f"  load {load():.2f}"]))
        finally:
            server.terminate()
            server.wait(timeout=30)
    for (checks, writer, count, rate), current in figures.items():
        before = figures.get(("before", writer, count, rate))
        if checks == "current" and before:
            # Phases alternate (--checks before,current,before,current,...): the median of each side.
            offered = f", {rate:g}/s offered" if rate else ""
            print(f"{writer}, {count} agents{offered}: current checks {statistics.median(current):.0f} msg/s "
                  f"({', '.join(f'{figure:.0f}' for figure in current)}), before {statistics.median(before):.0f} msg/s "
                  f"({', '.join(f'{figure:.0f}' for figure in before)}), "
                  f"current/before {statistics.median(current) / max(statistics.median(before), 1e-9):.2f}")
    stored = ContributionEvent.objects.filter(session__run=run).count()
    # Equal unless a connection closed with reports in flight ("closed" errors above): an ack is
    # sent only after its report is stored, so never more acknowledged than stored.
    commitments = StepCommitment.objects.filter(session__run=run).count()
    print(f"durable check: {stored} events stored, {acked} acknowledged"
          + (f"; {commitments} commitments stored" if args.commitment_every else ""))
    # Exactly once, per session: its agent sent seq 1..agent.seq, each of which must be stored, and once.
    held = {row["session_id"]: row for row in ContributionEvent.objects.filter(session__run=run).values("session_id")
            .annotate(rows=Count("id"), seqs=Count("seq", distinct=True))}
    missing = sum(agent.seq - held.get(agent.session_id, {"seqs": 0})["seqs"] for agent in agents)
    print(f"exactly once: {sum(agent.seq for agent in agents)} reports sent, {missing} never stored, "
          f"{sum(row['rows'] - row['seqs'] for row in held.values())} stored twice")


if __name__ == "__main__":
    main()
