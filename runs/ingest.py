"""Storing agents' contribution reports exactly once (the server side of `WS /ws/agent/`)."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import AgentToken
from peer_agent.protocol import Report
from runs.models import ContributionEvent, ReportRejection, Run, RunBan, TrainingSession

# Codes after which the agent must stop sending for this session (it tells the volunteer why).
FATAL_CODES = {"banned", "run_finished", "session_not_found"}


class ReportRefused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def report_session(*, token: AgentToken, session_id: int) -> TrainingSession:
    """The token owner's session that reports name, if it may still report; else ReportRefused."""
    session = TrainingSession.objects.select_related("run").filter(pk=session_id, user_id=token.user_id).first()
    if session is None:
        raise ReportRefused("session_not_found", f"there is no training session {session_id} of yours; join the run again")
    if token.run_id is not None and token.run_id != session.run_id:
        raise ReportRefused("session_not_found", f"agent token “{token.name}” is limited to another run")
    if session.run.status == Run.Status.FINISHED:
        raise ReportRefused("run_finished", f"run “{session.run.slug}” has finished and takes no more reports")
    if RunBan.objects.filter(run_id=session.run_id, user_id=session.user_id).exists():
        raise ReportRefused("banned", f"you were banned from run “{session.run.slug}”; reports are not counted")
    return session


def report_record(*, session: TrainingSession, report: Report) -> bool:
    """Store the report once; False when (session, seq) was stored before. Committed on return."""
    try:
        with transaction.atomic():
            ContributionEvent.objects.create(
                session=session,
                seq=report.seq,
                samples=report.samples,
                steps=report.steps,
                local_epoch=report.local_epoch,
                loss=report.loss,
                samples_per_second=report.samples_per_second,
                sent_at=report.sent_at,
            )
    except IntegrityError:
        return False
    return True


def report_rejection_record(*, session_id: int | None, seq: int | None, code: str, detail: str) -> None:
    """Keep a refused report for the run's organizers (the session may not exist: then no run to show it)."""
    session = TrainingSession.objects.filter(pk=session_id).first() if session_id else None
    if session is not None:
        ReportRejection.objects.create(session=session, seq=seq, code=code, detail=detail[:500])


def session_seen(*, session_id: int) -> None:
    TrainingSession.objects.filter(pk=session_id).update(last_seen_at=timezone.now())
