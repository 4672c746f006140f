"""Exactly-once progress reports: an on-disk spool and a websocket sender that drains it.

Every report is written to the session's spool before it is sent and stays there until the portal
acknowledges it (``{"type": "ack", "seq"}``, sent only once the report is stored). After a
reconnect, or a restart of the agent, the unacknowledged reports are sent again in ``seq`` order;
the portal acknowledges a repeated ``seq`` without counting it twice, so each report counts once.

The spool is one append-only JSON-lines file per session, ``session-<id>.jsonl``: a header line
(``{"type": "session", "session_id", "report_url", "run", "created_at"}``), then the report frames
exactly as sent, ``{"type": "ack", "seq"}`` and ``{"type": "dropped", "seq", "code", "detail"}``
lines, and after compaction a ``{"type": "summary", ...}`` line that replaces the settled history.
A torn last line (a crash mid-write) is cut off on open. A ``.lock`` file held with ``flock``
marks a spool its agent is still using, so a second agent on the same machine leaves it alone.

A restarted agent joins the run anew (new session, new peer key) and its :class:`Reporter`
delivers earlier sessions' leftover reports under their own session ids, each over its own
connection so that an error frame (which names only ``seq``) is never attributed to the wrong
session, and only to the same report socket, so that a token never goes to another portal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from peer_agent.portal import PAUSE_CODES, SESSION_OVER_CODES, StopReason, backoff_delay
from peer_agent.protocol import Ack, ErrorFrame, Report

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one agent per agent home there
    fcntl = None

logger = logging.getLogger(__name__)

RETRY_LATER_CODES = frozenset({"server_error", "internal_error", "busy", "rate_limited", "try_again"})
"""Error frames after which the report stays spooled and is sent again after a reconnect."""


class SpoolBusy(Exception):
    """Another running agent holds this session's spool."""


@dataclass
class SpoolSummary:
    """What one session's spool says about the contribution (for ``peer-agent status``)."""

    session_id: int
    run: str | None = None
    created_at: str | None = None
    last_seq: int = 0
    acked_reports: int = 0
    acked_samples: int = 0
    dropped_reports: int = 0
    dropped_samples: int = 0
    pending: dict[int, Report] = field(default_factory=dict, repr=False)

    @property
    def pending_samples(self) -> int:
        return sum(report.samples for report in self.pending.values())

    @property
    def reported_samples(self) -> int:
        return self.acked_samples + self.dropped_samples + self.pending_samples

    def _apply(self, line: str) -> None:
        entry = json.loads(line)
        kind = entry.get("type")
        if kind == "report":
            report = Report.model_validate_json(line)
            self.pending[report.seq] = report
            self.last_seq = max(self.last_seq, report.seq)
        elif kind in ("ack", "dropped") and entry.get("seq") in self.pending:
            report = self.pending.pop(entry["seq"])
            if kind == "ack":
                self.acked_reports, self.acked_samples = self.acked_reports + 1, self.acked_samples + report.samples
            else:
                self.dropped_reports, self.dropped_samples = self.dropped_reports + 1, self.dropped_samples + report.samples
        elif kind == "summary":
            for name in ("last_seq", "acked_reports", "acked_samples", "dropped_reports", "dropped_samples"):
                setattr(self, name, int(entry[name]))
        elif kind == "session":
            self.run, self.created_at = entry.get("run"), entry.get("created_at")


def spool_files(directory: Path) -> list[Path]:
    """Session spool files in ``directory``, oldest session first."""
    files = [path for path in Path(directory).glob("session-*.jsonl") if path.stem.removeprefix("session-").isdigit()]
    return sorted(files, key=lambda path: int(path.stem.removeprefix("session-")))


def spool_read(path: Path) -> tuple[dict[str, Any], SpoolSummary]:
    """Read a spool without locking or changing it: its header and its summary."""
    text = path.read_text(encoding="utf-8")
    complete, _, _torn = text.rpartition("\n")
    header: dict[str, Any] = {}
    summary = SpoolSummary(session_id=int(path.stem.removeprefix("session-")))
    for number, line in enumerate(complete.splitlines(), 1):
        try:
            if number == 1:
                header = json.loads(line)
            summary._apply(line)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("Skipping unreadable line %d of %s: %s", number, path, exc)
    return header, summary


class Spool:
    """The durable queue of one session's reports; thread-safe. Open with :meth:`open`."""

    compact_after_lines = 2000

    def __init__(self, path: Path, header: dict[str, Any], summary: SpoolSummary, lock_file: Any, lines: int):
        self.path, self.header, self._summary, self._lock_file, self._lines = path, header, summary, lock_file, lines
        self._changed = threading.Condition()
        self._file = open(path, "a", encoding="utf-8")

    @classmethod
    def open(cls, directory: Path, session_id: int, *, report_url: str | None = None, run: str | None = None) -> Spool:
        """Open (or create, given ``report_url``) the spool of ``session_id``; SpoolBusy if another agent has it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / f"session-{session_id}.jsonl"
        lock_file = open(directory / f"session-{session_id}.lock", "a")
        if fcntl is not None:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_file.close()
                raise SpoolBusy(f"session {session_id}'s spool is in use by another agent") from None
        if not path.exists():
            if report_url is None:
                lock_file.close()
                raise FileNotFoundError(path)
            header = {"type": "session", "session_id": session_id, "report_url": report_url, "run": run,
                      "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            _write_atomically(path, [json.dumps(header)])
        _cut_torn_tail(path)
        header, summary = spool_read(path)
        spool = cls(path, header, summary, lock_file, lines=0)
        spool._compact()
        return spool

    @property
    def session_id(self) -> int:
        return self._summary.session_id

    @property
    def report_url(self) -> str:
        return self.header["report_url"]

    @property
    def next_seq(self) -> int:
        with self._changed:
            return self._summary.last_seq + 1

    def add(self, report: Report) -> None:
        """Append ``report`` durably (fsync); its ``seq`` must be :attr:`next_seq`."""
        with self._changed:
            if report.session_id != self.session_id or report.seq != self._summary.last_seq + 1:
                raise ValueError(f"report {report.session_id}/{report.seq} does not continue session "
                                 f"{self.session_id} at seq {self._summary.last_seq + 1}")
            line = report.model_dump_json()
            self._append(line, sync=True)
            self._summary._apply(line)

    def pending(self) -> list[Report]:
        """Every report not yet acknowledged or dropped, in ``seq`` order."""
        with self._changed:
            return [self._summary.pending[seq] for seq in sorted(self._summary.pending)]

    def acked(self, seq: int) -> bool:
        """Record the portal's acknowledgement of ``seq``; False if it was not pending."""
        return self._settle({"type": "ack", "seq": seq})

    def dropped(self, seq: int, code: str, detail: str) -> bool:
        """Give up on report ``seq``: the portal refused it for good."""
        return self._settle({"type": "dropped", "seq": seq, "code": code, "detail": detail})

    def summary(self) -> SpoolSummary:
        with self._changed:
            copy = SpoolSummary(**{**self._summary.__dict__, "pending": dict(self._summary.pending)})
        return copy

    def wait_drained(self, timeout: float | None) -> bool:
        """Wait until nothing is pending; False if ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._summary.pending, timeout)

    def close(self) -> None:
        with self._changed:
            self._file.close()
            self._lock_file.close()  # releases the flock

    def _settle(self, entry: dict[str, Any]) -> bool:
        with self._changed:
            if entry["seq"] not in self._summary.pending:
                return False
            line = json.dumps(entry)
            # Acks are not fsynced: losing one to a crash only makes the portal see a duplicate it ignores.
            self._append(line, sync=False)
            self._summary._apply(line)
            if self._lines >= self.compact_after_lines:
                self._compact()
            self._changed.notify_all()
            return True

    def _append(self, line: str, *, sync: bool) -> None:
        self._file.write(line + "\n")
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self._lines += 1

    def _compact(self) -> None:
        """Rewrite the file as header + summary + pending reports."""
        s = self._summary
        totals = {"type": "summary", "last_seq": s.last_seq, "acked_reports": s.acked_reports,
                  "acked_samples": s.acked_samples, "dropped_reports": s.dropped_reports, "dropped_samples": s.dropped_samples}
        lines = [json.dumps(self.header), json.dumps(totals)]
        lines += [s.pending[seq].model_dump_json() for seq in sorted(s.pending)]
        self._file.close()
        _write_atomically(self.path, lines)
        self._file = open(self.path, "a", encoding="utf-8")
        self._lines = 0


def _write_atomically(path: Path, lines: list[str]) -> None:
    partial = path.with_suffix(".tmp")
    with open(partial, "w", encoding="utf-8") as file:
        file.write("".join(line + "\n" for line in lines))
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    if hasattr(os, "O_DIRECTORY"):
        descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _cut_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        logger.warning("Cutting off a half-written line at the end of %s (the agent stopped mid-write)", path)
        with open(path, "r+b") as file:
            file.truncate(data.rfind(b"\n") + 1)


@dataclass
class _Delivery:
    spool: Spool
    current: bool
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    halted: bool = False


class Reporter:
    """Sends one session's reports (and earlier sessions' leftovers) from a background thread.

    Call :meth:`report` after training steps; watch :attr:`stop_reason` (set when the portal says
    this session may not go on); :meth:`close` flushes with a bounded wait and stops the thread.
    """

    def __init__(self, spool_dir: Path, token: str, *, session_id: int, report_url: str, run: str | None = None,
                 backoff_s: float = 1.0, max_backoff_s: float = 60.0, window: int = 256,
                 connect: Callable[..., Any] = websockets.connect):
        self.spool_dir, self.token, self.window = Path(spool_dir), token, window
        self.backoff_s, self.max_backoff_s, self._connect = backoff_s, max_backoff_s, connect
        self.spool = Spool.open(self.spool_dir, session_id, report_url=report_url, run=run)
        self.stop_reason: StopReason | None = None
        self._deliveries = [_Delivery(self.spool, current=True)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._thread_main, name=f"reporter-{session_id}", daemon=True)

    def start(self) -> Reporter:
        """Start delivering, earlier sessions' leftovers included."""
        for path in spool_files(self.spool_dir):
            session_id = int(path.stem.removeprefix("session-"))
            header, summary = spool_read(path)
            # Only to the same portal's socket: this agent token must never go to another portal.
            if session_id == self.spool.session_id or not summary.pending or header.get("report_url") != self.spool.report_url:
                continue
            try:
                earlier = Spool.open(self.spool_dir, session_id)
            except SpoolBusy:
                continue
            logger.info("Delivering %d reports left over from session %d", len(earlier.pending()), session_id)
            self._deliveries.append(_Delivery(earlier, current=False))
        self._thread.start()
        return self

    def report(self, *, samples: int, steps: int, local_epoch: int, loss: float | None,
               samples_per_second: float) -> Report:
        """Spool a report of the work since the previous one, and send it when connected."""
        report = Report(session_id=self.spool.session_id, seq=self.spool.next_seq, samples=samples, steps=steps,
                        local_epoch=local_epoch, loss=loss, samples_per_second=min(samples_per_second, 1e6),
                        sent_at=datetime.now(timezone.utc))
        self.spool.add(report)
        if self._loop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the report stays spooled
                self._loop.call_soon_threadsafe(self._deliveries[0].wake.set)
        return report

    def flush(self, timeout: float | None) -> bool:
        """Wait until the portal has acknowledged every report, earlier sessions' included, or delivery
        stopped; True if this session's reports are all acknowledged."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        for delivery in self._deliveries:
            while self._thread.is_alive() and not delivery.halted and time.monotonic() < deadline:
                if delivery.spool.wait_drained(min(0.2, deadline - time.monotonic())):
                    break
        return not self.spool.pending()

    def close(self, timeout: float = 10.0) -> bool:
        """Flush for at most ``timeout`` seconds, then stop; unsent reports stay on disk for the next start."""
        drained = self.flush(timeout)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=5.0)
        for delivery in self._deliveries:
            delivery.spool.close()
        if not drained:
            logger.warning("%d reports are kept on disk; they will be sent when the agent next runs",
                           len(self.spool.pending()))
        return drained

    def _thread_main(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        for delivery in self._deliveries:
            delivery.wake = asyncio.Event()
        await asyncio.gather(*(self._deliver(delivery) for delivery in self._deliveries))

    def _finished(self, delivery: _Delivery) -> bool:
        drained = not delivery.spool.pending()
        return delivery.halted or self._stopping.is_set() or (drained and not delivery.current)

    async def _deliver(self, delivery: _Delivery) -> None:
        session_id, attempt = delivery.spool.session_id, 0
        headers = {"Authorization": f"Bearer {self.token}"}
        while not self._finished(delivery):
            try:
                async with self._connect(delivery.spool.report_url, additional_headers=headers, open_timeout=10) as ws:
                    if attempt:
                        logger.info("Reconnected to the portal's report socket (session %d)", session_id)
                    attempt = 0
                    await self._exchange(ws, delivery)
                    continue
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403):
                    self._halt(delivery, StopReason("unauthorized", f"the portal refused the report socket (HTTP {status}): "
                                                                    "the agent token is not valid for it any more"))
                    break
                problem = f"HTTP {status}"
            except (OSError, TimeoutError, asyncio.TimeoutError, ConnectionClosed, InvalidHandshake, InvalidURI) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            attempt += 1
            delay = backoff_delay(attempt, self.backoff_s, self.max_backoff_s)
            log = logger.warning if attempt == 1 else logger.debug
            log("No connection to the portal's report socket (%s); %d reports wait on disk; retrying in %.1f s",
                problem, len(delivery.spool.pending()), delay)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass
        if not delivery.current and not delivery.spool.pending():
            logger.info("Delivered every report of earlier session %d", session_id)

    async def _exchange(self, ws: Any, delivery: _Delivery) -> None:
        """Send pending reports (at most ``window`` unacknowledged) until finished or disconnected."""
        in_flight: set[int] = set()
        sent_upto = 0
        receiver = asyncio.create_task(self._receive(ws, delivery, in_flight))
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            while not self._finished(delivery):
                for report in delivery.spool.pending():
                    if report.seq > sent_upto and len(in_flight) < self.window:
                        await ws.send(report.model_dump_json())
                        in_flight.add(report.seq)
                        sent_upto = report.seq
                delivery.wake.clear()
                woken = asyncio.create_task(delivery.wake.wait())
                await asyncio.wait({woken, receiver, stopping}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if receiver.done():
                    receiver.result()  # raises ConnectionClosed, or returns when the server closed cleanly
                    raise ConnectionClosed(None, None)
        finally:
            receiver.cancel()
            stopping.cancel()

    async def _receive(self, ws: Any, delivery: _Delivery, in_flight: set[int]) -> None:
        async for message in ws:
            try:
                kind = json.loads(message).get("type")
                if kind == "ack":
                    seq = Ack.model_validate_json(message).seq
                    delivery.spool.acked(seq)
                    in_flight.discard(seq)
                elif kind == "error":
                    frame = ErrorFrame.model_validate_json(message)
                    in_flight.discard(frame.seq)
                    if self._on_error(delivery, frame):
                        return  # reconnect: the report is sent again on the new connection
                else:
                    logger.debug("Ignoring a frame of type %r from the portal", kind)
            except (ValueError, AttributeError) as exc:
                logger.warning("Ignoring an unreadable frame from the portal: %s", exc)
            delivery.wake.set()

    def _on_error(self, delivery: _Delivery, frame: ErrorFrame) -> bool:
        """Handle an error frame; True to reconnect and resend."""
        session_id = delivery.spool.session_id
        if frame.code in SESSION_OVER_CODES or frame.code in PAUSE_CODES:
            logger.warning("The portal says about session %d: %s (%s)", session_id, frame.detail, frame.code)
            if frame.code in PAUSE_CODES and delivery.current:
                self.stop_reason = self.stop_reason or StopReason(frame.code, frame.detail)
            else:
                self._halt(delivery, StopReason(frame.code, frame.detail))
        elif frame.code in RETRY_LATER_CODES:
            logger.warning("The portal could not store a report now (%s: %s); sending it again", frame.code, frame.detail)
            return True
        elif frame.seq is not None:
            if delivery.spool.dropped(frame.seq, frame.code, frame.detail):
                logger.warning("The portal refused report %d of session %d (%s: %s); dropped it, since sending it "
                               "again cannot succeed", frame.seq, session_id, frame.code, frame.detail)
        else:
            logger.warning("The portal refused a frame (%s: %s)", frame.code, frame.detail)
        return False

    def _halt(self, delivery: _Delivery, reason: StopReason) -> None:
        delivery.halted = True
        if delivery.current:
            self.stop_reason = reason
        elif delivery.spool.pending():
            logger.warning("Session %d's %d remaining reports stay on disk (%s)", delivery.spool.session_id,
                           len(delivery.spool.pending()), reason.detail)
        delivery.wake.set()

