"""Stand-ins for the portal that the agent's tests run against (test_reporter.py, test_bandwidth.py,
test_cli.py): `/ws/agent/` as its contract describes it, the bandwidth probes, and the agent token
both accept."""

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from datetime import UTC
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from peer_agent.protocol import ProtocolError, Report, parse_client_frame

TOKEN = "agt_secret"
MIB = 1 << 20


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ContractServer:
    """``/ws/agent/`` as the contract describes it, with knobs to misbehave."""

    def __init__(self, port: int | None = None, *, ack: bool = True, drop_every: int | None = None,
                 errors: dict[int, tuple[str, str]] | None = None):
        self.port = port or free_port()
        self.ack, self.drop_every, self.errors = ack, drop_every, errors or {}
        self.stored: dict[tuple[int, int], int] = {}
        self.frames = self.connections = self.duplicates = 0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/agent/"

    def samples(self, session_id: int) -> int:
        return sum(samples for (session, _), samples in self.stored.items() if session == session_id)

    def seqs(self, session_id: int) -> list[int]:
        return sorted(seq for session, seq in self.stored if session == session_id)

    def start(self) -> "ContractServer":
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(ready)), daemon=True)
        self._thread.start()
        assert ready.wait(5)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(5)

    async def _main(self, ready: threading.Event) -> None:
        self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self._handle, "127.0.0.1", self.port, process_request=self._authenticate):
            ready.set()
            await self._stopped.wait()

    def _authenticate(self, connection, request):
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return connection.respond(401, "invalid agent token\n")
        return None

    async def _handle(self, ws) -> None:
        self.connections += 1
        async for message in ws:
            self.frames += 1
            try:
                report = parse_client_frame(message)
            except ProtocolError as exc:
                await ws.send(exc.to_frame().model_dump_json())
                continue
            if self.drop_every and self.frames % self.drop_every == 0:
                if self.frames % (2 * self.drop_every) == 0:
                    self._store(report)  # stored, but the ack is lost with the connection
                ws.transport.abort()
                return
            if report.seq in self.errors:
                code, detail = self.errors[report.seq]
                await ws.send(json.dumps({"type": "error", "seq": report.seq, "code": code, "detail": detail}))
                continue
            self._store(report)
            if self.ack:
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(json.dumps({"type": "ack", "seq": report.seq}))

    def _store(self, report: Report) -> None:
        key = (report.session_id, report.seq)
        if key in self.stored:
            self.duplicates += 1
        else:
            self.stored[key] = report.samples


class ProbeRoutes:
    """The portal's two probe endpoints, answered inside any ``BaseHTTPRequestHandler``."""

    def __init__(self, *, token: str = TOKEN, delay_s: float = 0.0, upload_limit: int = 2 * MIB):
        self.token, self.delay_s, self.upload_limit = token, delay_s, upload_limit
        self.downloads: list[int] = []
        self.uploads: list[int] = []

    def answer(self, handler: BaseHTTPRequestHandler) -> bool:
        """Answer a probe request and return True; False when it is for another path."""
        url = urlsplit(handler.path)
        if (handler.command, url.path) == ("GET", "/api/v1/probe/download"):
            if self._authorized(handler):
                size = int(parse_qs(url.query).get("size", [str(4 * MIB)])[0])
                time.sleep(self.delay_s)
                self.downloads.append(size)
                send(handler, 200, os.urandom(size))
            return True
        if (handler.command, url.path) == ("POST", "/api/v1/probe/upload"):
            size = len(handler.rfile.read(int(handler.headers.get("Content-Length", 0))))
            if self._authorized(handler):
                time.sleep(self.delay_s)
                if size > self.upload_limit:
                    send(handler, 413, {"error": {"code": "probe_too_large", "detail": "upload at most 1 MiB"}})
                else:
                    self.uploads.append(size)
                    send(handler, 200, {"bytes": size})
            return True
        return False

    def _authorized(self, handler: BaseHTTPRequestHandler) -> bool:
        if handler.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        send(handler, 401, {"error": {"code": "token_unknown", "detail": "this agent token does not exist"}})
        return False


def send(handler: BaseHTTPRequestHandler, status: int, body: dict | bytes) -> None:
    """Answer with ``body``: bytes as they are, anything else as JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/octet-stream" if isinstance(body, bytes) else "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def report(session_id: int, seq: int, samples: int = 1) -> Report:
    """A report as the agent's spool holds it."""
    from datetime import datetime

    return Report(session_id=session_id, seq=seq, samples=samples, steps=1, local_epoch=0, loss=None,
                  samples_per_second=1.0, sent_at=datetime.now(UTC))
