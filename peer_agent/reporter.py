"""Exactly-once progress reports: a websocket sender that drains the session's spool (:mod:`peer_agent.spool`).

Every report is written to the session's spool before it is sent and stays there until the portal
acknowledges it (``{"type": "ack", "seq"}``, sent only once the report is stored). After a
reconnect, or a restart of the agent, the unacknowledged reports are sent again in ``seq`` order;
the portal acknowledges a repeated ``seq`` without counting it twice, so each report counts once.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from peer_agent.portal import PAUSE_CODES, SESSION_OVER_CODES, StopReason, backoff_delay
from peer_agent.protocol import Ack, EpochCommitment, ErrorFrame, Report
from peer_agent.spool import Spool, SpoolBusy, spool_files, spool_read

logger = logging.getLogger(__name__)

RETRY_LATER_CODES = frozenset({"server_error", "internal_error", "busy", "rate_limited", "try_again", "too_many_connections"})
"""Error frames after which the report stays spooled and is sent again after a reconnect."""


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
               samples_per_second: float, commitment: EpochCommitment | None = None) -> Report:
        """Spool a report of the work since the previous one (with an epoch's commitment, if given),
        and send it when connected."""
        report = Report(session_id=self.spool.session_id, seq=self.spool.next_seq, samples=samples, steps=steps,
                        local_epoch=local_epoch, loss=loss, samples_per_second=min(samples_per_second, 1e6),
                        sent_at=datetime.now(UTC), commitment=commitment)
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
            # The loop may close between the check and the call (a halted session ends the thread): it stops anyway.
            with contextlib.suppress(RuntimeError):
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
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake, InvalidURI) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            attempt += 1
            delay = backoff_delay(attempt, self.backoff_s, self.max_backoff_s)
            log = logger.warning if attempt == 1 else logger.debug
            log("No connection to the portal's report socket (%s); %d reports wait on disk; retrying in %.1f s",
                problem, len(delivery.spool.pending()), delay)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            except TimeoutError:
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

