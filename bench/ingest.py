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
reports. With `--viewers`, that many browsers watch `WS /ws/runs/{slug}/live/` while 100 agents
report: snapshots delivered per second and how far apart viewers get the same snapshot.

The per-connection rate limit (5 reports/s) is lifted in the server: this measures capacity.
`--writers` compares ways of storing: `batch` (runs.ingest.reports.ReportWriter, what the portal uses),
`per_report` (a transaction per report on a pool thread), `one_thread` (a transaction per report
on Channels' single sync thread, the baseline of docs/design.md).

    DATABASE_URL=postgres://... .venv/bin/python -m bench.ingest --agents 100 1000 --viewers 500
"""

import argparse
import asyncio
import base64
import dataclasses
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

WRITER_ENV = "BENCH_INGEST_WRITER"
CHECKS_ENV = "BENCH_INGEST_CHECKS"
# The checks that judge claims on the portal's evidence (docs/trust.md); `--checks before` serves
# the agent socket without them, the baseline of the same run.
EVIDENCE_RULES = ("local_epoch_ahead_of_swarm", "speed_beyond_device", "samples_beyond_session_budget")


# --- the server side (runs inside uvicorn) ------------------------------------------------------

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
    from django.urls import path

    from portal.asgi import django_asgi_app
    from portal.routing import websocket_urlpatterns
    from runs.ingest import consumers, reports

    class EchoConsumer(AsyncWebsocketConsumer):
        channel_layer_alias = None  # bare, like the agent socket: no channel layer

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
    return ProtocolTypeRouter({
        "http": django_asgi_app,
        "websocket": URLRouter([path("ws/echo/", EchoConsumer.as_asgi()), *websocket_urlpatterns]),
    })


def server_start(port: int, writer: str, conn_max_age: int, checks: str = "current") -> subprocess.Popen:
    env = {**os.environ, WRITER_ENV: writer, CHECKS_ENV: checks, "DB_CONN_MAX_AGE": str(conn_max_age)}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "bench.ingest:server_application", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log", "--lifespan", "off"], env=env)
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
    errors: dict[str, int] = field(default_factory=dict)

    def line(self, name: str, seconds: float) -> str:
        rate = len(self.latencies) / seconds
        ordered = sorted(self.latencies) or [float("nan")]
        p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        errors = f"  errors {self.errors}" if self.errors else ""
        return f"{name:<26} {rate:9.0f} msg/s   p50 {p50 * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms{errors}"


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
    """Volunteers, tokens and sessions for `count` agents, straight through the ORM; with ``keyed``, each
    session has a peer key of its own, as a join proves it, to sign commitments with."""
    from django.utils import timezone
    from hivemind.utils.crypto import RSAPrivateKey

    from accounts.models import User
    from accounts.services import token_create
    from runs.models import TrainingSession

    stamp = int(time.time())
    names = [f"bench-{stamp}-{i}" for i in range(count)]
    verified = timezone.now()
    users = User.objects.bulk_create([User(username=name, email=f"{name}@example.org", email_verified_at=verified)
                                      for name in names])
    agents = []
    for user in users:
        token, secret = token_create(user=user, name="bench")
        key = RSAPrivateKey() if keyed else None
        session = TrainingSession.objects.create(
            run=peer_batch_run, user=user, token=token, agent_version="bench",
            peer_public_key=key.get_public_key().to_bytes().decode() if key else "ssh-rsa AAAA",
            access_expires_at=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
        agents.append(Agent(secret=secret, session_id=session.pk, key=key, run_id=peer_batch_run.hivemind_run_id))
    return agents


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
                rate: float = 0.0) -> Tally:
    """Every agent connects, then all send: in a closed loop (the next report once the previous is
    answered) or, with ``rate``, at that many reports/s in all, each agent on its own schedule
    whether or not its previous report was answered yet. Answers inside the window are timed."""
    import websockets

    tally = Tally()
    connected, start = asyncio.Event(), asyncio.Event()
    ready = 0
    opening = asyncio.Semaphore(100)

    def answered(answer: dict) -> bool:
        if answer.get("type") == "error":
            tally.errors[answer["code"]] = tally.errors.get(answer["code"], 0) + 1
            return False
        tally.answers += 1
        return True

    async def closed_loop(ws, agent: Agent, window_from: float, window_to: float) -> None:
        while (sent := time.perf_counter()) < window_to:
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
                except websockets.ConnectionClosed:
                    # Reports in flight may be stored without an ack: an agent would resend them.
                    tally.errors["closed"] = tally.errors.get("closed", 0) + 1
                    return
                at = time.perf_counter()
                sent = sent_at.pop(answer.get("seq"), None)
                if answered(answer) and sent is not None and window_from <= at <= window_to:
                    tally.latencies.append(at - sent)

        receiving = asyncio.create_task(receive())
        due = time.perf_counter() + interval * index / len(agents)  # spread the agents over one interval
        while due < window_to:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            text = frame(agent)
            sent_at[agent.seq] = time.perf_counter()
            await ws.send(text)
            due += interval
        sending = False
        if not sent_at:
            receiving.cancel()  # it waits for an answer that no report will bring
        await asyncio.wait_for(asyncio.gather(receiving, return_exceptions=True), timeout=60)

    async def one(index: int, agent: Agent) -> None:
        nonlocal ready
        async with opening:
            # No permessage-deflate: it would cost the echo (long frames both ways) more than an ack.
            ws = await websockets.connect(f"{base}{path}", additional_headers={"Authorization": f"Bearer {agent.secret}"},
                                          open_timeout=60, ping_interval=None, compression=None)
        try:
            # The first report authenticates the session and loads its pace: done before the window.
            await ws.send(frame(agent))
            answered(json.loads(await ws.recv()))
            ready += 1
            if ready == len(agents):
                connected.set()
            await start.wait()
            window_from, window_to = time.perf_counter() + warmup, time.perf_counter() + warmup + seconds
            try:
                if rate:
                    await paced(ws, agent, index, window_from, window_to)
                else:
                    await closed_loop(ws, agent, window_from, window_to)
            except websockets.ConnectionClosed:
                tally.errors["closed"] = tally.errors.get("closed", 0) + 1
        finally:
            await ws.close()

    tasks = [asyncio.create_task(one(index, agent)) for index, agent in enumerate(agents)]
    await asyncio.wait_for(connected.wait(), timeout=300)
    start.set()
    await asyncio.gather(*tasks)
    return tally


async def watch(base: str, slug: str, viewers: int, agents: list[Agent], peer_batch: int, seconds: float) -> tuple[int, str]:
    """`viewers` browsers on the live page while the agents report; delivered snapshots and spread."""
    import websockets

    received: list[list[tuple[float, int]]] = [[] for _ in range(viewers)]
    stop = asyncio.Event()
    opening = asyncio.Semaphore(100)

    async def viewer(index: int) -> None:
        async with opening:
            ws = await websockets.connect(f"{base}/ws/runs/{slug}/live/", origin=base.replace("ws://", "http://"),
                                          open_timeout=60, ping_interval=None, max_size=None)
        try:
            while not stop.is_set():
                try:
                    text = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                received[index].append((time.perf_counter(), hash(text)))
        finally:
            await ws.close()

    viewing = [asyncio.create_task(viewer(i)) for i in range(viewers)]
    await asyncio.sleep(2)
    began = time.perf_counter()
    reporting = asyncio.create_task(drive(base, "/ws/agent/", agents, lambda a: report_frame(a, peer_batch), 0, seconds))
    tally = await reporting
    ended = time.perf_counter()
    stop.set()
    await asyncio.gather(*viewing, return_exceptions=True)
    first_seen: dict[int, float] = {}
    for times in received:
        for at, text in times:
            if began <= at <= ended:
                first_seen[text] = min(first_seen.get(text, at), at)
    delivered = [(at, text) for times in received for at, text in times if began <= at <= ended]
    spread = sorted(at - first_seen[text] for at, text in delivered) or [float("nan")]
    watching = sum(1 for times in received if times)
    reports = tally.answers / (ended - began)
    return tally.answers, (f"{viewers} viewers ({watching} got snapshots), {len(agents)} agents sending {reports:.0f} reports/s: "
            f"{len(delivered) / (ended - began):.0f} snapshots/s delivered "
            f"({len(delivered) / (ended - began) / max(watching, 1):.2f} per viewer per s), "
            f"{len(first_seen) / (ended - began):.2f} distinct snapshots/s; same snapshot reached viewers within "
            f"p50 {spread[len(spread) // 2] * 1000:.0f} ms, p99 {spread[int(len(spread) * 0.99)] * 1000:.0f} ms of the first")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1000], help="concurrent agents, one measurement each")
    parser.add_argument("--writers", default="batch,per_report,one_thread", help="storing strategies to compare")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent before the window opens")
    parser.add_argument("--rate", type=float, nargs="+", default=[0.0],
                        help="reports/s offered by all agents together, one measurement each (0: closed loop, capacity)")
    parser.add_argument("--viewers", type=int, default=0, help="live-page viewers to measure fan-out with (0: skip)")
    parser.add_argument("--conn-max-age", type=int, default=60, help="DB_CONN_MAX_AGE of the server (0: a connection per call)")
    parser.add_argument("--checks", default="current",
                        help="the agent socket's checks: current, or before (without the ones that judge claims on the "
                             "portal's evidence); with both, each figure's ratio current/before is printed")
    parser.add_argument("--commitment-every", type=int, default=0,
                        help="reports per epoch: every that many, a report carries the closed epoch's signed commitment "
                             "(0: none); `--checks before` then checks its signature only, as before issue 29")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from runs.models import ContributionEvent, StepCommitment

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    call_command("migrate", verbosity=0)
    run = run_create(f"bench-ingest-{int(time.time())}")
    training = run.config["training"]
    peer_batch = training["per_device_batch_size"] * training.get("gradient_accumulation_steps", 1)
    micro_batch_size = training["per_device_batch_size"]
    agents = agents_create(max(args.agents), run, keyed=bool(args.commitment_every))
    load = lambda: os.getloadavg()[0]  # noqa: E731
    print(f"database {engine}, channel layer {settings.CHANNEL_LAYERS['default']['BACKEND'].rsplit('.', 1)[-1]}, "
          f"{os.cpu_count()} CPUs, load {load():.2f}, window {args.seconds:g} s after {args.warmup:g} s")
    acked = 0
    figures: dict[tuple[str, str, int, float], list[float]] = {}
    phases = [(checks, writer) for writer in args.writers.split(",") for checks in args.checks.split(",")]
    for index, (checks, writer) in enumerate(phases):
        port = args.port + index  # the previous server's port may still be closing
        base = f"ws://127.0.0.1:{port}"
        server = server_start(port, writer, args.conn_max_age, checks)
        try:
            for count in args.agents:
                for rate in args.rate:
                    some = agents[:count]
                    frame = lambda agent: report_frame(agent, peer_batch, args.commitment_every, micro_batch_size)  # noqa: E731
                    ingest = asyncio.run(drive(base, "/ws/agent/", some, frame, args.warmup, args.seconds, rate))
                    # The same frames, from copies: what the echo is sent is not stored, so it must not move
                    # the agents' epochs and stream cursors past what the portal holds.
                    copies = [dataclasses.replace(agent) for agent in some]
                    echo = asyncio.run(drive(base, "/ws/echo/", copies, frame, args.warmup, args.seconds, rate))
                    acked += ingest.answers
                    figures.setdefault((checks, writer, count, rate), []).append(len(ingest.latencies) / args.seconds)
                    ratio = len(ingest.latencies) / max(len(echo.latencies), 1)
                    offered = f", {rate:g}/s offered" if rate else ""
                    print(ingest.line(f"{writer} ({checks} checks), {count} agents{offered}", args.seconds))
                    print(echo.line(f"echo, {count} agents{offered}", args.seconds)
                          + f"   ingest/echo {ratio:.2f}   load {load():.2f}")
            if args.viewers and writer == "batch":
                answers, line = asyncio.run(watch(base, run.slug, args.viewers, agents[:100], peer_batch, args.seconds))
                acked += answers
                print(line)
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


if __name__ == "__main__":
    main()
