"""Storing agents' contribution reports exactly once (the server side of `WS /ws/agent/`).

Three parts: which session a report may name (`report_session` when a connection first names it,
then `RunAdmissions` every few seconds), whether the report is plausible (`report_check`, the
rules in `RULES`), and storing it (`ReportWriter`, shared by every agent socket of the process).
Exactly-once rests on the (session, seq) unique constraint alone: a report that is resent,
reordered or stored twice by two connections is one row.
"""

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from channels.db import database_sync_to_async
from django.db import DatabaseError, connection, models, transaction
from django.utils import timezone

from accounts.models import AgentToken
from peer_agent.protocol import Report, commitment_message
from runs.access.authority import peer_key_proof_verify
from runs.models import (
    ContributionEvent,
    ReportRejection,
    Run,
    RunBan,
    RunMembership,
    RunSample,
    StepCommitment,
    TrainingSession,
)
from runs.setup.compute import RUN_PACE_SLACK, SWARM_EPOCH_AHEAD, samples_per_second_ceiling

logger = logging.getLogger(__name__)

# Codes after which the agent must stop sending for this session (it tells the volunteer why).
FATAL_CODES = {"banned", "run_finished", "session_not_found", "token_revoked", "token_expired", "not_allowed",
               "session_ended", "session_suspended"}
# An ended session (closed after 15 minutes of silence) still takes the reports its agent spooled
# through an outage for this long; after it, its socket is refused like a banned one.
ENDED_SESSION_GRACE = timedelta(hours=1)
SWARM_READING_FRESH = timedelta(minutes=1)


def db(function: Callable) -> Callable:
    """`function` as a coroutine for consumers. PostgreSQL takes calls from many pool threads at
    once (each its own connection); SQLite has one writer, and an in-memory test database fails
    ("table is locked") instead of waiting, so there every call goes to Channels' one thread."""
    return database_sync_to_async(function, thread_sensitive=connection.vendor == "sqlite")


class ReportRefused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def report_session(*, token: AgentToken, session_id: int) -> tuple[TrainingSession, "RunAdmission"]:
    """The token owner's session that reports name, if it may still report (else ReportRefused),
    and its run's admission."""
    session = TrainingSession.objects.select_related("run").filter(pk=session_id, user_id=token.user_id).first()
    if session is None:
        raise ReportRefused("session_not_found", f"there is no training session {session_id} of yours; join the run again")
    if token.run_id is not None and token.run_id != session.run_id:
        raise ReportRefused("session_not_found", f"agent token “{token.name}” is limited to another run")
    # The same rules the connection re-checks later through RunAdmissions.
    admission = run_admission(run_id=session.run_id, token_ids=frozenset({token.pk}))
    admission_check(admission=admission, session=session, token=token)
    return session, admission


@dataclass(frozen=True)
class RunAdmission:
    """What may have changed about a run since a connection first checked its session: the run's
    status, who is banned from it or no longer on its invite or allow list, which of the agent
    tokens reporting to it were revoked or have expired, and the swarm's epoch as the coordinator's
    monitor last read it (None without a reading from the last minute)."""

    status: str | None  # None: the run was deleted
    slug: str
    banned: frozenset[int]
    refused_tokens: dict[int, str]  # token id -> "token_revoked" or "token_expired"
    not_allowed: frozenset[int] = frozenset()  # owners of the tokens who may no longer train in the run
    swarm_epoch: int | None = None
    suspended: frozenset[int] = frozenset()  # sessions that spot checks suspended (runs.credit.verification)


def run_admission(*, run_id: int, token_ids: frozenset[int]) -> RunAdmission:
    """A handful of queries for the whole run, however many sessions report to it."""
    run = Run.objects.filter(pk=run_id).values("status", "slug", "visibility").first()
    if run is None:
        return RunAdmission(status=None, slug="", banned=frozenset(), refused_tokens={})
    banned = frozenset(RunBan.objects.filter(run_id=run_id).values_list("user_id", flat=True))
    refused = {}
    now = timezone.now()
    for pk, revoked_at in AgentToken.objects.filter(pk__in=token_ids).filter(
            models.Q(revoked_at__isnull=False) | models.Q(expires_at__lte=now)).values_list("pk", "revoked_at"):
        refused[pk] = "token_revoked" if revoked_at else "token_expired"
    return RunAdmission(status=run["status"], slug=run["slug"], banned=banned, refused_tokens=refused,
                        not_allowed=_not_allowed(run_id=run_id, visibility=run["visibility"], token_ids=token_ids),
                        swarm_epoch=_swarm_epoch(run_id=run_id, now=now),
                        suspended=frozenset(TrainingSession.objects.filter(run_id=run_id, suspended_at__isnull=False)
                                            .values_list("pk", flat=True)))


def _swarm_epoch(*, run_id: int, now: datetime) -> int | None:
    """The swarm's epoch as the coordinator's monitor read it within SWARM_READING_FRESH."""
    reading = RunSample.objects.filter(run_id=run_id, at__gte=now - SWARM_READING_FRESH).order_by("-at")
    return reading.values_list("global_epoch", flat=True).first()


def _not_allowed(*, run_id: int, visibility: str, token_ids: frozenset[int]) -> frozenset[int]:
    """The owners of these tokens whom an invite-only or allowlisted run no longer admits."""
    if visibility not in (Run.Visibility.INVITE, Run.Visibility.ALLOWLIST):
        return frozenset()
    owners = set(AgentToken.objects.filter(pk__in=token_ids).values_list("user_id", flat=True))
    admitted = set(Run.organizers.through.objects.filter(run_id=run_id, user_id__in=owners).values_list("user_id", flat=True))
    if visibility == Run.Visibility.INVITE:
        admitted |= set(RunMembership.objects.filter(run_id=run_id, user_id__in=owners).values_list("user_id", flat=True))
    else:
        admitted |= set(Run.allowlist.through.objects.filter(run_id=run_id, user_id__in=owners).values_list("user_id", flat=True))
    return frozenset(owners - admitted)


def admission_check(*, admission: RunAdmission, session: TrainingSession, token: AgentToken) -> None:
    """ReportRefused if the run, a ban, the run's list of who may train, the session's end or the
    token's state now refuses reports of this session."""
    if admission.status is None:
        raise ReportRefused("session_not_found", f"there is no training session {session.pk} any more; join again")
    if admission.status == Run.Status.FINISHED:
        raise ReportRefused("run_finished", f"run “{admission.slug}” has finished and takes no more reports")
    if session.user_id in admission.banned:
        raise ReportRefused("banned", f"you were banned from run “{admission.slug}”; reports are not counted")
    if session.user_id in admission.not_allowed:
        raise ReportRefused("not_allowed", f"run “{admission.slug}” no longer lists you among who may train; "
                                           "reports are not counted")
    if session.pk in admission.suspended:
        raise ReportRefused("session_suspended", f"training session {session.pk} was suspended: its work failed spot "
                                                 "checks (the run's organizer can lift it); reports are not counted")
    if session.ended_at is not None and timezone.now() - session.ended_at > ENDED_SESSION_GRACE:
        raise ReportRefused("session_ended", f"training session {session.pk} ended at {session.ended_at:%Y-%m-%d %H:%M} "
                                             "UTC; join the run again")
    code = admission.refused_tokens.get(token.pk)
    if code is not None:
        state = "was revoked" if code == "token_revoked" else "expired"
        raise ReportRefused(code, f"agent token “{token.name}” {state}; reports are not counted")


class RunAdmissions:
    """Each run's `RunAdmission`, shared by every agent socket of the process and fetched again
    once it is ``max_age`` seconds old, by one database call however many sockets wait for it.

    A connection checks its session fully once (`report_session`); re-checking every session
    on its own every few seconds cost, at 100 agents, 200 queries that arrived together and
    held acks back by up to half a second (docs/benchmarks.md, section 5); at 10,000 agents it
    would be 4,000 queries/s. While the next fetch is in flight, reports read the last answer as
    long as it is younger than twice ``max_age``: at 10,000 sockets, every report waiting for the
    fetch every 5 s held acks back by seconds (docs/benchmarks.md, section 25). So a ban or a
    revocation stops credit within twice ``max_age``; with ``max_age`` 0 every report waits.
    """

    def __init__(self, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age, self.clock = max_age, clock
        # Per event loop, as ReportWriter: a fetch in flight is a task of one loop (and in tests, where
        # run ids restart with each database, a loop's answers are not another test's).
        self._fetches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, tuple[float, asyncio.Task]]] = (
            weakref.WeakKeyDictionary())
        # run id -> when the fetch that answered began, and its answer
        self._answers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, tuple[float, RunAdmission]]] = (
            weakref.WeakKeyDictionary())
        self._tokens: dict[int, set[int]] = {}  # run id -> tokens whose sockets reported to it

    async def admission(self, *, run_id: int, token_id: int) -> RunAdmission:
        loop = asyncio.get_running_loop()
        fetches = self._fetches.setdefault(loop, {})
        # A token joins the next fetch: it was checked when its socket connected, so a revocation
        # since then shows with the next answer, as for the other tokens.
        tokens = self._tokens.setdefault(run_id, set())
        tokens.add(token_id)
        answers = self._answers.setdefault(loop, {})
        now = self.clock()
        answered_at, answer = answers.get(run_id, (-float("inf"), None))
        if now - answered_at < self.max_age:
            return answer
        fetch = fetches.get(run_id)
        if fetch is None or now - fetch[0] >= self.max_age or fetch[1].done():
            fetch = (now, loop.create_task(db(run_admission)(run_id=run_id, token_ids=frozenset(tokens))))
            fetch[1].add_done_callback(lambda task, began=now: self._answered(answers, run_id, began, task))
            fetches[run_id] = fetch
        if now - answered_at < 2 * self.max_age:
            return answer
        # Shielded: a socket that closes while it waits must not cancel the others' fetch.
        return await asyncio.shield(fetch[1])

    @staticmethod
    def _answered(answers: dict[int, tuple[float, RunAdmission]], run_id: int, began: float,
                  fetch: asyncio.Task) -> None:
        if fetch.cancelled() or fetch.exception() is not None:
            return  # the next report fetches again; one that waited sees the error
        if began > answers.get(run_id, (-float("inf"), None))[0]:
            answers[run_id] = (began, fetch.result())


# --- plausibility ------------------------------------------------------------------------------
# Reported samples are claims; the coordinator later verifies them against the DHT. These rules
# refuse, at the door, claims that no honest agent sends. Each refusal is an error frame naming
# the rule and a ReportRejection row for the organizer; the report earns nothing, the connection
# and the volunteer's other sessions go on. The schema (peer_agent.protocol.Report) already
# refuses negative or non-finite figures and caps each field.

CLOCK_SKEW = timedelta(minutes=5)  # agents' clocks are NTP-synced; hivemind itself refuses > 60 s
# hivemind learns the collaboration's progress from the DHT: after each epoch a peer accumulates
# into its new epoch until a fetch of that progress succeeds, and a fetch has no deadline (a dead
# peer in the routing table slows it). In CI an honest agent's reports of ~40 s were refused so.
PROGRESS_LAG = 60.0
# After WARMUP_REPORTS, a report's samples_per_second counts toward the session's best (which widens
# samples_beyond_run_pace) at most SPEED_JUMP × the best so far; the report itself is accepted. A machine
# can get that much faster: an agent's first minute on a loaded host reported 12 samples/s, and 95 once
# the load ended (tests/e2e/test_preemption.py), and refusing the report dropped its samples.
SPEED_JUMP = 8.0
WARMUP_REPORTS = 10  # data loading and the first steps are slow
EPOCH_RESYNC = 1  # a peer that loads state from others may land one epoch back
# A commitment earns only if it arrives before the swarm is this many epochs past its epoch: the
# validator holds the states of these epochs (runs/swarm/spotcheck.py, HELD_EPOCHS), and a commitment
# sent later, once the steps it claims can no longer be checked, would ask to be believed unchecked.
# An honest agent sends it with its first report after the epoch (every 5 s).
COMMITMENT_WINDOW_EPOCHS = 6
LATE_COMMITMENT = ("epoch {epoch}: committed when the swarm was at epoch {swarm}, after the deadline ({window} "
                   "epochs): too late to be checked, so the epoch earns nothing")
# How many samples' worth of micro-batches a session's stream may have been drawn to, against the samples
# it reported: an honest agent draws each reported sample once, plus the micro-batches of steps hivemind
# dropped (a resync) and of the step in progress. Bounds the validator's replay of a session's stream.
CURSOR_SLACK = 2.0


@dataclass
class SessionPace:
    """What the portal knows of one session's reports, kept by the consumer in memory so the rules
    cost no database round trip (seeded once from the stored reports)."""

    started_at: datetime  # the portal's clock, when the session was opened
    target_batch_size: int  # samples the whole run gathers per collaboration epoch
    peer_batch: int  # samples in one local step of the session's peer
    # The session's micro-batch, fixed at join (TrainingSession.micro_batch_size): its commitments use it.
    micro_batch_size: int = 1
    # The most samples per second the session's declared device could train of the run's model
    # (runs/setup/compute.py): what bounds its claims from the first report.
    samples_ceiling: float = float("inf")
    aggregator: bool = False  # the session joined as an aggregator: it computes nothing
    counted: int = 0  # samples of every report accepted for the session, whatever its seq
    swarm_epoch: int | None = None  # the swarm's epoch as the coordinator's monitor last read it
    last: Report | None = None  # the accepted report with the highest seq
    max_speed: float = 0.0  # highest samples_per_second accepted
    accepted: int = 0
    acked: set[int] = field(default_factory=set)  # seqs acknowledged on this connection

    def speed_counted(self, report: Report) -> float:
        """The report's samples_per_second as the pace counts it: at most what the device could train, and
        after WARMUP_REPORTS at most SPEED_JUMP × the best so far."""
        speed = min(report.samples_per_second, self.samples_ceiling)
        if self.accepted >= WARMUP_REPORTS:
            speed = min(speed, SPEED_JUMP * max(self.max_speed, float(self.peer_batch)))
        return speed

    def accept(self, report: Report) -> None:
        if self.last is None or report.seq > self.last.seq:
            self.last = report
        self.max_speed = max(self.max_speed, self.speed_counted(report))
        self.accepted += 1
        self.counted += report.samples
        self.acked.add(report.seq)

    def following(self, report: Report) -> Report | None:
        """The report this one follows, when it is newer than every accepted one (else None:
        a late or resent report is judged on its own)."""
        return self.last if self.last is not None and report.seq > self.last.seq else None


def session_pace(*, session: TrainingSession) -> SessionPace:
    """The pace of a session as stored: two queries when a connection first names the session."""
    config = session.run.configuration
    training = config.training
    micro_batch_size = session.micro_batch_size or training.per_device_batch_size
    pace = SessionPace(
        started_at=session.started_at,
        target_batch_size=training.target_batch_size,
        peer_batch=micro_batch_size * training.gradient_accumulation_steps,
        micro_batch_size=micro_batch_size,
        samples_ceiling=samples_per_second_ceiling(config, str((session.device or {}).get("kind", ""))),
        aggregator=session.role == TrainingSession.Role.AGGREGATOR,
    )
    stored = ContributionEvent.objects.filter(session=session)
    pace.counted = stored.aggregate(total=models.Sum("samples"))["total"] or 0
    latest = stored.order_by("-seq").first()
    if latest is not None:
        pace.last = Report(session_id=session.pk, seq=latest.seq, samples=latest.samples, steps=latest.steps,
                           local_epoch=latest.local_epoch, samples_per_second=latest.samples_per_second,
                           sent_at=latest.sent_at)
        pace.max_speed = latest.samples_per_second
    return pace


def report_session_paced(*, token: AgentToken, session_id: int,
                         paced: bool) -> tuple[TrainingSession, SessionPace | None, RunAdmission]:
    """`report_session`, and the session's pace unless the caller has it already (one thread hop)."""
    session, admission = report_session(token=token, session_id=session_id)
    return session, None if paced else session_pace(session=session), admission


Rule = Callable[[Report, SessionPace, datetime], str | None]


def samples_from_aggregator(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """Any samples from an aggregator's session: it joined to average, not to compute, and earns no credit."""
    if pace.aggregator and (report.samples or report.steps):
        return (f"session joined as an aggregator, which computes nothing, but reported {report.samples} samples "
                f"in {report.steps} steps; join as a trainer to contribute")


def sent_in_future(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """sent_at more than CLOCK_SKEW ahead of the portal's clock."""
    if report.sent_at > now + CLOCK_SKEW:
        return f"sent_at {report.sent_at.isoformat()} is ahead of the portal's clock ({now.isoformat()}); sync the agent's clock"


def sent_before_session(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """sent_at before the session began (beyond CLOCK_SKEW): work from before the join is not this session's."""
    if report.sent_at < pace.started_at - CLOCK_SKEW:
        return f"sent_at {report.sent_at.isoformat()} is before the session began ({pace.started_at.isoformat()})"


def local_epoch_backwards(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """local_epoch lower than the previous report's by more than EPOCH_RESYNC."""
    previous = pace.following(report)
    if previous is not None and report.local_epoch < previous.local_epoch - EPOCH_RESYNC:
        return f"local_epoch went back from {previous.local_epoch} to {report.local_epoch}"


def samples_beyond_run_pace(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """More samples than the whole run gathers in the epochs that passed since the previous report
    (RUN_PACE_SLACK × target_batch_size per epoch, counting the current one), plus what the session
    computes at its best accepted speed while its view of the collaboration lags (PROGRESS_LAG). A session's
    first report has no accepted speed: its own (within its device's ceiling) stands in. Without it, an
    agent's first 2 s at 68 samples/s in one epoch of 32 samples (hivemind counts steps toward the epoch
    while its round is arranged) were refused, and the session's commitments then reached too far for its
    counted samples (CI, tests/e2e/test_faults.py and tests/e2e/test_spot_checks_with_agents.py)."""
    previous = pace.following(report)
    epochs = 1 + max(0, report.local_epoch - previous.local_epoch) if previous is not None else 1
    best = pace.max_speed if pace.accepted else max(pace.max_speed, pace.speed_counted(report))
    allowed = RUN_PACE_SLACK * pace.target_batch_size * epochs + best * PROGRESS_LAG
    if report.samples > allowed:
        return (f"{report.samples} samples in {epochs} epoch(s), but the whole run gathers "
                f"{pace.target_batch_size} per epoch")


def local_epoch_ahead_of_swarm(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """local_epoch more than SWARM_EPOCH_AHEAD past the swarm's epoch as the coordinator's monitor read
    it in the last minute (no bound without such a reading): an epoch the swarm does not reach
    never closes, and its claims would wait for a verdict for good."""
    if pace.swarm_epoch is not None and report.local_epoch > pace.swarm_epoch + SWARM_EPOCH_AHEAD:
        return (f"local_epoch {report.local_epoch} is far ahead of the swarm's epoch {pace.swarm_epoch}; "
                "the agent is not in this run's swarm")


def speed_beyond_device(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """samples_per_second above what the device the session declared could train of the run's model
    (runs/setup/compute.py: its FLOPs per sample against a generous peak of the device kind)."""
    if report.samples_per_second > pace.samples_ceiling:
        return (f"samples_per_second {report.samples_per_second:g} is more than this device could train of the "
                f"run's model ({pace.samples_ceiling:.3g} samples/s)")


def session_samples_budget(pace: SessionPace, now: datetime) -> float:
    """The most samples the session's declared device could have trained since it began, on the portal's
    clock: the ceiling × the time since the join, plus one target batch."""
    return pace.samples_ceiling * max(0.0, (now - pace.started_at).total_seconds()) + pace.target_batch_size


def samples_beyond_session_budget(report: Report, pace: SessionPace, now: datetime) -> str | None:
    """More samples in the session, this report included, than its device could have trained since
    the session began, on the portal's clock: the ceiling × the time since the join, plus one
    target batch. Every accepted report counts, whatever its seq or its sent_at."""
    elapsed = max(0.0, (now - pace.started_at).total_seconds())
    allowed = session_samples_budget(pace, now)
    if pace.counted + report.samples > allowed:
        return (f"{pace.counted + report.samples} samples in {elapsed:.0f} s since the session began is more than "
                f"this device could train ({pace.samples_ceiling:.3g} samples/s)")


# Checked in this order; the first that fails names the refusal.
RULES: tuple[tuple[str, Rule], ...] = (
    ("samples_from_aggregator", samples_from_aggregator),
    ("sent_in_future", sent_in_future),
    ("sent_before_session", sent_before_session),
    ("local_epoch_backwards", local_epoch_backwards),
    ("local_epoch_ahead_of_swarm", local_epoch_ahead_of_swarm),
    ("samples_beyond_run_pace", samples_beyond_run_pace),
    ("speed_beyond_device", speed_beyond_device),
    ("samples_beyond_session_budget", samples_beyond_session_budget),
)


def report_check(*, report: Report, pace: SessionPace, now: datetime | None = None) -> ReportRefused | None:
    """The first plausibility rule the report breaks, as a refusal; None when it may be stored."""
    now = now or timezone.now()
    for code, rule in RULES:
        detail = rule(report, pace, now)
        if detail is not None:
            return ReportRefused(code, detail)
    return None


# --- storing ---------------------------------------------------------------------------------

def commitment_refusal(*, report: Report, session: TrainingSession, pace: SessionPace) -> ReportRefused | None:
    """Why the report's commitment cannot stand (the frame is then refused whole), or None: it must
    be for an epoch the session has reached, of the micro-batch size the session declared at join,
    with no step of more samples than a micro-batch, and signed by the session's own peer key.
    Micro-batches of one sample, or of a million, would make the validator's replay of the stream as
    long as the agent likes. How far its cursors reach is :func:`commitment_beyond_reach`'s."""
    commitment = report.commitment
    if commitment is None:
        return None
    if commitment.epoch > report.local_epoch:
        return ReportRefused("invalid_commitment", f"a commitment for epoch {commitment.epoch} came with a report of "
                                                   f"epoch {report.local_epoch}: only closed epochs are committed to")
    if commitment.micro_batch_size != pace.micro_batch_size:
        return ReportRefused("invalid_commitment", f"micro-batches of {commitment.micro_batch_size} samples, not the "
                                                   f"{pace.micro_batch_size} this session declared when it joined")
    if any(step.samples > commitment.micro_batch_size for step in commitment.steps):
        return ReportRefused("invalid_commitment", f"a committed micro-batch holds more samples than the commitment's "
                                                   f"micro-batch size ({commitment.micro_batch_size})")
    message = commitment_message(run_id=session.run.hivemind_run_id, session_id=session.pk, commitment=commitment)
    if not peer_key_proof_verify(peer_public_key=session.peer_public_key, message=message, proof=commitment.signature):
        return ReportRefused("invalid_commitment", "the commitment is not signed by this session's peer key")
    return None


def commitment_beyond_reach(*, report: Report, pace: SessionPace) -> str | None:
    """Why the report's (well-formed, signed) commitment reaches further into the session's stream than
    its reported samples allow, or None. The validator replays the stream up to each checked step, so
    this bounds a replay's cost by the session's own work. The report is stored all the same and only
    the commitment is dropped, unchecked: its epoch earns nothing. Refusing the report whole would
    leave it uncounted, so after one refusal (a resync that dropped many drawn steps) every later
    commitment would reach too far again, and the session's reports would be refused for good."""
    commitment = report.commitment
    if commitment is None:
        return None
    drawn = (commitment.steps[-1].cursor + 1) * commitment.micro_batch_size
    reported = pace.counted + report.samples
    if drawn > CURSOR_SLACK * reported + pace.target_batch_size:
        return (f"epoch {commitment.epoch}: the commitment reaches micro-batch {commitment.steps[-1].cursor} of the "
                f"session's stream ({drawn} samples), further than the {reported} samples the session reported "
                f"allow: it cannot be checked, so the epoch earns nothing")
    return None


def report_event(*, session_id: int, report: Report) -> ContributionEvent:
    return ContributionEvent(
        session_id=session_id, seq=report.seq, samples=report.samples, steps=report.steps,
        local_epoch=report.local_epoch, loss=report.loss, samples_per_second=report.samples_per_second,
        sent_at=report.sent_at,
    )


def report_commitment(*, session_id: int, report: Report, swarm_epoch: int | None = None,
                      beyond_reach: str | None = None) -> StepCommitment | None:
    """The report's commitment as stored: pending a check, or unchecked for good when it came after the
    deadline (the swarm, as the monitor last read it, more than COMMITMENT_WINDOW_EPOCHS past its epoch)
    or reaches further than the session's work (``beyond_reach``, :func:`commitment_beyond_reach`;
    its steps are not kept)."""
    commitment = report.commitment
    if commitment is None:
        return None
    if beyond_reach is not None:
        return StepCommitment(
            session_id=session_id, epoch=commitment.epoch, micro_batch_size=commitment.micro_batch_size,
            shuffle_buffer=commitment.shuffle_buffer, samples=sum(step.samples for step in commitment.steps), steps=[],
            outcome=StepCommitment.Outcome.UNCHECKED, checked_at=timezone.now(), check_detail=beyond_reach[:500])
    stored = StepCommitment(
        session_id=session_id, epoch=commitment.epoch, micro_batch_size=commitment.micro_batch_size,
        shuffle_buffer=commitment.shuffle_buffer, samples=sum(step.samples for step in commitment.steps),
        steps=[[step.cursor, step.samples, step.fingerprint, *([step.parameters] if step.parameters else [])]
               for step in commitment.steps])
    if swarm_epoch is not None and commitment.epoch < swarm_epoch - COMMITMENT_WINDOW_EPOCHS:
        stored.outcome, stored.checked_at = StepCommitment.Outcome.UNCHECKED, timezone.now()
        stored.check_detail = LATE_COMMITMENT.format(epoch=commitment.epoch, swarm=swarm_epoch,
                                                     window=COMMITMENT_WINDOW_EPOCHS)
    return stored


def report_events_store(*, events: list[ContributionEvent], commitments: list[StepCommitment] = ()) -> None:
    """Insert the events and their commitments in one transaction; a (session, seq) stored before is
    skipped, and so is a commitment for a (session, epoch) that has one: the first stands. Committed on return."""
    with transaction.atomic():
        ContributionEvent.objects.bulk_create(events, ignore_conflicts=True)
        StepCommitment.objects.bulk_create(commitments, ignore_conflicts=True)


def report_events_store_each(*, events: list[ContributionEvent],
                             commitments: list[StepCommitment | None]) -> list[Exception | None]:
    """Insert each event (with its commitment) in its own transaction, so one bad row does not fail the others."""
    outcomes: list[Exception | None] = []
    for event, commitment in zip(events, commitments, strict=True):
        try:
            report_events_store(events=[event], commitments=[commitment] if commitment else [])
            outcomes.append(None)
        except Exception as error:  # noqa: BLE001 - reported to that one report's sender
            logger.warning("could not store report %s of session %s: %r", event.seq, event.session_id, error)
            outcomes.append(error)
    return outcomes


class ReportWriter:
    """Stores the reports of every agent socket of this process in shared transactions.

    A transaction per report spends its time in the commit and in thread hops, and Channels'
    default puts every consumer's database call on one thread (docs/design.md: ~136 reports/s). Here
    reports queue while the previous batch commits, so batches grow with the load and latency
    stays one commit at low load. `store` returns only after the report's batch has committed,
    so an ack that follows it still means "durably stored".
    """

    max_batch = 1000
    # Seconds between last_seen_at updates of one session: a quarter of the two minutes a session counts as
    # live (runs/access/sessions.py). At 5 s, 10,000 agents reporting every 5 s cost the writer an update
    # per report, half its time (docs/benchmarks.md, section 25).
    seen_every = 30.0

    def __init__(self) -> None:
        # One queue and drain task per event loop (tests run each communicator in its own loop).
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue] = weakref.WeakKeyDictionary()
        self._seen_at: dict[int, float] = {}
        # Sessions to note as seen, and the one task noting them, per event loop
        self._unseen: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[int]] = weakref.WeakKeyDictionary()
        self._noting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task] = weakref.WeakKeyDictionary()

    async def store(self, *, session_id: int, report: Report, swarm_epoch: int | None = None,
                    beyond_reach: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = asyncio.Queue()
            loop.create_task(self._drain(queue))
        stored = loop.create_future()
        queue.put_nowait((report_event(session_id=session_id, report=report),
                          report_commitment(session_id=session_id, report=report, swarm_epoch=swarm_epoch,
                                            beyond_reach=beyond_reach), stored))
        await stored

    async def _drain(self, queue: asyncio.Queue) -> None:
        while True:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < self.max_batch:
                batch.append(queue.get_nowait())
            try:
                await self._store(batch)
            except Exception as error:  # noqa: BLE001 - the writer must outlive any failure, or every agent waits forever
                logger.exception("storing a batch of %d reports failed", len(batch))
                for *_, stored in batch:
                    if not stored.done():
                        stored.set_exception(error)

    async def _store(self, batch: list[tuple[ContributionEvent, StepCommitment | None, asyncio.Future]]) -> None:
        events = [event for event, _, _ in batch]
        commitments = [commitment for _, commitment, _ in batch]
        try:
            await db(report_events_store)(events=events, commitments=[c for c in commitments if c is not None])
            outcomes: list[Exception | None] = [None] * len(batch)
        except Exception:  # noqa: BLE001 - one bad row (a session deleted meanwhile) must not fail the rest
            outcomes = await db(report_events_store_each)(events=events, commitments=commitments)
        for (*_, stored), outcome in zip(batch, outcomes, strict=True):
            if stored.done():  # its consumer went away; the row stands and a resend is acked
                continue
            if outcome is None:
                stored.set_result(None)
            else:
                stored.set_exception(outcome)
        self._note_seen({event.session_id for event in events})

    def _note_seen(self, session_ids: set[int]) -> None:
        """Note the sessions not noted for a while, beside the writer: one UPDATE at a time, of every
        session waiting, while the next batches commit. Awaited in the writer's loop, the update took
        61% of its time at 10,000 sockets and held the next batch's acks (docs/benchmarks.md, section 25)."""
        now = time.monotonic()
        stale = {pk for pk in session_ids if self._seen_at.get(pk, 0.0) < now - self.seen_every}
        if not stale:
            return
        self._seen_at.update(dict.fromkeys(stale, now))
        loop = asyncio.get_running_loop()
        self._unseen.setdefault(loop, set()).update(stale)
        noting = self._noting.get(loop)
        if noting is None or noting.done():
            self._noting[loop] = loop.create_task(self._sessions_note(self._unseen[loop]))

    @staticmethod
    async def _sessions_note(unseen: set[int]) -> None:
        while unseen:
            session_ids = sorted(unseen)
            unseen.clear()
            await db(sessions_seen)(session_ids=session_ids)


report_writer = ReportWriter()


def report_rejection_record(*, user_id: int, session_id: int | None, seq: int | None, code: str, detail: str) -> None:
    """Keep a refused report for the run's organizers, against the sender's own session only: a
    frame naming another volunteer's session (or none that exists) leaves no row in their record."""
    session = TrainingSession.objects.filter(pk=session_id, user_id=user_id).first() if session_id else None
    if session is not None:
        ReportRejection.objects.create(session=session, seq=seq, code=code, detail=detail[:500])


def sessions_seen(*, session_ids: list[int]) -> None:
    """Note that the sessions are alive; for people, so a failure is logged and never fails a report."""
    try:
        TrainingSession.objects.filter(pk__in=session_ids).update(last_seen_at=timezone.now())
    except DatabaseError as error:
        logger.warning("could not note sessions %s as seen: %r", session_ids, error)
