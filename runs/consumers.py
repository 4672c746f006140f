"""`WS /ws/agent/`: agents' contribution reports, acknowledged only once durably stored."""

import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from accounts.auth import bearer_secret
from accounts.services import AgentTokenRefused, token_authenticate
from peer_agent.protocol import Ack, ErrorFrame, ProtocolError, Report, parse_client_frame
from runs import ingest
from runs.models import Run

logger = logging.getLogger(__name__)

# Each call gets a pool thread: one agent's slow write must not queue every other agent's
# behind it on Channels' single sync thread (PITFALLS: that capped ingest near 136 msg/s).
db = database_sync_to_async
SESSION_RECHECK_SECONDS = 5.0
REPORTS_PER_SECOND = float(settings.REPORT_RATE_PER_SECOND)
BURST = settings.REPORT_RATE_BURST  # a reconnecting agent resends its spool at once


class AgentConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        headers = dict(self.scope.get("headers", []))
        client = self.scope.get("client") or [None]
        await self.accept()
        try:
            secret = bearer_secret(headers.get(b"authorization", b"").decode("latin-1"))
            self.token = await db(token_authenticate, thread_sensitive=False)(secret=secret, ip=client[0])
        except AgentTokenRefused as refusal:
            await self._send_error(None, refusal.code, refusal.detail)
            await self.close(code=4401)
            return
        self.sessions: dict[int, tuple[object, float]] = {}
        self.allowance, self.allowance_at = float(BURST), time.monotonic()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not hasattr(self, "sessions"):
            return
        try:
            report = parse_client_frame(text_data if text_data is not None else "")
        except ProtocolError as error:
            await self._send_error(error.seq, error.code, error.detail)
            return
        if not self._within_rate():
            # Not recorded: a flood must not become a flood of writes.
            await self._send_error(report.seq, "rate_limited", f"at most {REPORTS_PER_SECOND:g} reports per second; resend later")
            return
        try:
            session = await self._session(report.session_id)
        except ingest.ReportRefused as refusal:
            await self._refuse(report, refusal.code, refusal.detail)
            return
        created = await db(ingest.report_record, thread_sensitive=False)(session=session, report=report)
        if created:
            await self._mark_seen(report.session_id)
        await self.send(Ack(seq=report.seq).model_dump_json())
        if session.run.status == Run.Status.PAUSED:
            # Work done before the pause counts; the notice tells the agent to stop and wait.
            await self._send_error(None, "run_paused", f"run “{session.run.slug}” is paused by its organizer; the agent will retry every 60 s")

    def _within_rate(self) -> bool:
        now = time.monotonic()
        self.allowance = min(BURST, self.allowance + (now - self.allowance_at) * REPORTS_PER_SECOND)
        self.allowance_at = now
        if self.allowance < 1:
            return False
        self.allowance -= 1
        return True

    async def _session(self, session_id: int):
        """The session, re-checked every few seconds so that bans and finished runs act quickly."""
        cached = self.sessions.get(session_id)
        if cached and time.monotonic() - cached[1] < SESSION_RECHECK_SECONDS:
            return cached[0]
        session = await db(ingest.report_session, thread_sensitive=False)(token=self.token, session_id=session_id)
        self.sessions[session_id] = (session, time.monotonic())
        return session

    async def _mark_seen(self, session_id: int) -> None:
        # last_seen is for humans; once per recheck period keeps the session row cool.
        cached = self.sessions.get(session_id)
        if cached and getattr(cached[0], "_seen_at", 0) < time.monotonic() - SESSION_RECHECK_SECONDS:
            cached[0]._seen_at = time.monotonic()
            await db(ingest.session_seen, thread_sensitive=False)(session_id=session_id)

    async def _refuse(self, report: Report, code: str, detail: str) -> None:
        await db(ingest.report_rejection_record, thread_sensitive=False)(
            session_id=report.session_id, seq=report.seq, code=code, detail=detail
        )
        await self._send_error(report.seq, code, detail)
        if code in ingest.FATAL_CODES:
            logger.info("session %s refused for good: %s", report.session_id, code)

    async def _send_error(self, seq: int | None, code: str, detail: str) -> None:
        await self.send(ErrorFrame(seq=seq, code=code, detail=detail[:1000]).model_dump_json())
