"""`WS /ws/agent/`: agents' contribution reports, acknowledged only once durably stored."""

import logging
import time

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError

from accounts.auth import bearer_secret
from accounts.services import AgentTokenRefused, token_authenticate
from peer_agent.protocol import Ack, ErrorFrame, ProtocolError, Report, parse_client_frame
from portal.logs import log_context
from portal.metrics import AGENT_SOCKETS_OPEN, INGEST_ACK_SECONDS, REPORTS_ACCEPTED, REPORTS_REFUSED
from portal.ratelimit import RateLimited
from runs.ingest import reports
from runs.ingest.token_sockets import token_sockets_for_settings
from runs.models import Run, TrainingSession

logger = logging.getLogger(__name__)

db = reports.db  # on PostgreSQL, not every agent's calls queued on one thread (docs/design.md, "One sync thread")
SESSION_RECHECK_SECONDS = 5.0
run_admissions = reports.RunAdmissions(max_age=SESSION_RECHECK_SECONDS)
REPORTS_PER_SECOND = float(settings.REPORT_RATE_PER_SECOND)
BURST = settings.REPORT_RATE_BURST  # a reconnecting agent resends its spool at once
# Open agent sockets per agent token, in every web process: each agent holds one, and each costs a
# process a connection's memory and a pace; a token cannot open them by the thousand.
token_sockets = token_sockets_for_settings()


class AgentConsumer(AsyncWebsocketConsumer):
    # Agents get nothing through the channel layer; without it, a connection holds no blocking
    # Redis BRPOP of its own (with channels_redis, one Redis connection per agent).
    channel_layer_alias = None

    async def dispatch(self, message: dict) -> None:
        # Channels' dispatch first hops to its one sync thread to close stale database connections,
        # for every frame: a thread round trip per report, queued behind every other socket's.
        # Each database call here runs through database_sync_to_async, which does that itself.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        headers = dict(self.scope.get("headers", []))
        client = self.scope.get("client") or [None]
        await self.accept()
        try:
            secret = bearer_secret(headers.get(b"authorization", b"").decode("latin-1"))
            self.token = await db(token_authenticate)(secret=secret, ip=client[0])
        except AgentTokenRefused as refusal:
            await self._send_error(None, refusal.code, refusal.detail)
            await self.close(code=4401)
            return
        except RateLimited as limited:  # this address sent too many refused tokens
            await self._send_error(None, "rate_limited", limited.detail)
            await self.close(code=4429)
            return
        except DatabaseError:
            # The database is away (restarting): no fault of the agent's, which connects again later.
            logger.warning("agent socket: could not check the token now", exc_info=True)
            await self._send_error(None, "server_error", "the portal cannot check agent tokens now; connect again later")
            await self.close(code=1011)
            return
        self.socket_id = await token_sockets.socket_admit(token_id=self.token.pk, limit=settings.AGENT_TOKEN_MAX_SOCKETS)
        if self.socket_id is None:
            await self._send_error(None, "too_many_connections", f"agent token “{self.token.name}” already has "
                                   f"{settings.AGENT_TOKEN_MAX_SOCKETS} connections open; close one first")
            await self.close(code=4429)
            return
        AGENT_SOCKETS_OPEN.inc()
        self.counted_token = self.token.pk
        self.sessions: dict[int, TrainingSession] = {}
        self.paces: dict[int, reports.SessionPace] = {}
        self.allowance, self.allowance_at, self.limited = float(BURST), time.monotonic(), False

    async def disconnect(self, code: int) -> None:
        token = getattr(self, "counted_token", None)
        if token is not None:
            AGENT_SOCKETS_OPEN.dec()
            await token_sockets.socket_release(token_id=token, socket_id=self.socket_id)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not hasattr(self, "sessions"):
            return
        received = time.perf_counter()
        try:
            report = parse_client_frame(text_data if text_data is not None else "")
        except ProtocolError as error:
            await self._report_error(error.seq, error.code, error.detail)
            return
        try:
            with log_context(session_id=report.session_id):  # on every log line the report causes
                await self._report_receive(report, received=received)
        except DatabaseError:
            # The database is away (restarting): the agent keeps the report and sends it again.
            logger.warning("agent socket: report %s of session %s not handled now", report.seq, report.session_id, exc_info=True)
            await self._report_error(report.seq, "server_error", "the report could not be handled now; it will be sent again")

    async def _report_receive(self, report: Report, *, received: float) -> None:
        if not self._within_rate():
            await self._rate_limited(report)
            return
        try:
            session, status = await self._session(report.session_id)
        except reports.ReportRefused as refusal:
            await self._refuse(report, refusal)
            return
        pace = self.paces[session.pk]
        if report.seq not in pace.acked:  # acknowledged on this connection before: ack again, nothing to store
            refusal = reports.report_check(report=report, pace=pace) or reports.commitment_refusal(
                report=report, session=session, pace=pace)
            if refusal is not None:
                await self._refuse(report, refusal)
                return
            beyond_reach = reports.commitment_beyond_reach(report=report, pace=pace)
            if beyond_reach is not None:  # the samples count; the commitment is dropped, and recorded as refused
                await db(reports.report_rejection_record)(
                    user_id=self.token.user_id, session_id=report.session_id, seq=report.seq,
                    code="invalid_commitment", detail=beyond_reach)
            try:
                await reports.report_writer.store(session_id=session.pk, report=report, swarm_epoch=pace.swarm_epoch,
                                                  beyond_reach=beyond_reach)
            except Exception:  # noqa: BLE001 - logged by the writer; the agent keeps the report and resends it
                await self._report_error(report.seq, "server_error", "the report could not be stored now; it will be sent again")
                return
            pace.accept(report)
            REPORTS_ACCEPTED.inc()
        await self.send(Ack(seq=report.seq).model_dump_json())
        INGEST_ACK_SECONDS.observe(time.perf_counter() - received)
        if status == Run.Status.PAUSED:
            # Work done before the pause counts; the notice tells the agent to stop and wait.
            detail = f"run “{session.run.slug}” is paused by its organizer; the agent will retry every 60 s"
            await self._send_error(None, "run_paused", detail)

    def _within_rate(self) -> bool:
        now = time.monotonic()
        self.allowance = min(BURST, self.allowance + (now - self.allowance_at) * REPORTS_PER_SECOND)
        self.allowance_at = now
        if self.allowance < 1:
            return False
        self.allowance -= 1
        self.limited = False
        return True

    async def _rate_limited(self, report: Report) -> None:
        detail = f"at most {REPORTS_PER_SECOND:g} reports per second; resend later"
        if not self.limited:
            # Recorded once per flood: a flood must not become a flood of writes.
            self.limited = True
            await db(reports.report_rejection_record)(
                user_id=self.token.user_id, session_id=report.session_id, seq=report.seq, code="rate_limited",
                detail=detail)
        await self._report_error(report.seq, "rate_limited", detail)

    async def _session(self, session_id: int) -> tuple[TrainingSession, str]:
        """The session and its run's status: checked fully when this connection first names the
        session, then re-checked through the run's shared admission, so that bans, finished runs
        and revoked tokens act within twice SESSION_RECHECK_SECONDS (reports.RunAdmissions)."""
        session = self.sessions.get(session_id)
        if session is None:
            session, pace, admission = await db(reports.report_session_paced)(
                token=self.token, session_id=session_id, paced=session_id in self.paces)
            if pace is not None:
                self.paces[session_id] = pace
            self.sessions[session_id] = session
        else:
            admission = await run_admissions.admission(run_id=session.run_id, token_id=self.token.pk)
            reports.admission_check(admission=admission, session=session, token=self.token)
        self.paces[session_id].swarm_epoch = admission.swarm_epoch
        return session, admission.status

    async def _refuse(self, report: Report, refusal: reports.ReportRefused) -> None:
        await db(reports.report_rejection_record)(
            user_id=self.token.user_id, session_id=report.session_id, seq=report.seq, code=refusal.code,
            detail=refusal.detail)
        await self._report_error(report.seq, refusal.code, refusal.detail)
        if refusal.code in reports.FATAL_CODES:
            logger.info("session %s refused for good: %s", report.session_id, refusal.code)

    async def _report_error(self, seq: int | None, code: str, detail: str) -> None:
        """Answer a report frame with an error, counted by its code (a bounded set: the protocol's and the rules')."""
        REPORTS_REFUSED.labels(code=code).inc()
        await self._send_error(seq, code, detail)

    async def _send_error(self, seq: int | None, code: str, detail: str) -> None:
        await self.send(ErrorFrame(seq=seq, code=code, detail=detail[:1000]).model_dump_json())
