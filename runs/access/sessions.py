"""Training sessions: who may join a run, and the hivemind credentials the portal issues them."""

import datetime

from django.conf import settings
from django.core import signing
from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from packaging.version import Version

from accounts.models import AgentToken, User
from peer_agent.protocol import (
    SWARM_COMPATIBLE_SINCE,
    JoinRequest,
    access_username,
    join_proof_message,
)
from runs.access.authority import access_token_sign, authority_load, peer_key_proof_verify
from runs.access.rules import JoinRefused, run_join_refusal, run_role_refusal
from runs.models import Checkpoint, DataFile, Run, TrainingSession

_FILE_SIGNER_SALT = "runs.data-file"
_CHECKPOINT_SIGNER_SALT = "runs.checkpoint"


COORDINATOR_RETRY_SECONDS = 10
KEY_PROOF_MAX_AGE = datetime.timedelta(minutes=5)
# A session counts as live while its agent was heard from this recently (a crashed agent's session
# stops counting then, long before it is closed as silent).
LIVE_SESSION_SEEN_WITHIN = datetime.timedelta(minutes=2)  # agents' clocks are NTP-synced; hivemind's tokens allow 60 s


def _access_token(*, run: Run, user: User, peer_public_key: str, role: str) -> tuple[dict, datetime.datetime]:
    lifetime = datetime.timedelta(minutes=settings.HIVEMIND_ACCESS_MINUTES)
    private_key = authority_load(encrypted=run.authority_private_key, secret=settings.AUTHORITY_ENCRYPTION_KEY)
    access = access_token_sign(private_key=private_key, username=access_username(user.username, role),
                               peer_public_key=peer_public_key, lifetime=lifetime)
    return access, timezone.now() + lifetime


def agent_version_refusal(version: str) -> JoinRefused | None:
    """Why an agent of this version may not train with the others, or None when it may."""
    parsed = Version(version)  # JoinRequest's pattern admits only versions that parse
    if parsed < Version(SWARM_COMPATIBLE_SINCE):
        return JoinRefused(409, "agent_outdated", f"peer-agent {parsed} cannot average with this portal's agents; install "
                                                  f"peer-agent {SWARM_COMPATIBLE_SINCE} or newer from the run's join page")
    return None


def _key_proof_check(*, run: Run, request: JoinRequest) -> None:
    """JoinRefused unless the join is signed, recently, with the private half of its peer key."""
    skew = abs((timezone.now() - request.signed_at).total_seconds())
    if skew > KEY_PROOF_MAX_AGE.total_seconds():
        # 403, not 400: the request is well formed, its proof is not accepted (a replay, or a wrong clock).
        raise JoinRefused(403, "key_proof_stale", f"the join was signed {skew:.0f} s away from the portal's clock (at most "
                                                  f"{KEY_PROOF_MAX_AGE.total_seconds():.0f} s); sync this machine's clock")
    message = join_proof_message(run=run.slug, peer_public_key=request.peer_public_key, signed_at=request.signed_at)
    if not peer_key_proof_verify(peer_public_key=request.peer_public_key, message=message, proof=request.key_proof):
        raise JoinRefused(403, "key_proof_invalid", "key_proof is not a signature of this join by the peer key's holder; "
                                                    "an agent can join only with a key it holds")


def _live_sessions_check(*, token: AgentToken) -> None:
    """JoinRefused when the token, or its owner across tokens, already has as many live sessions as
    the settings allow: each session is a machine training, and claims scale with them. Counted in
    the database, so for every web process at once; the volunteer's row is locked until the join's
    transaction ends, so that two joins at once (in two processes) cannot both count the sessions
    before either is stored and both take the last place."""
    list(User.objects.select_for_update().filter(pk=token.user_id).values_list("pk"))
    live = TrainingSession.objects.filter(ended_at=None, last_seen_at__gte=timezone.now() - LIVE_SESSION_SEEN_WITHIN)
    if live.filter(token=token).count() >= settings.AGENT_TOKEN_MAX_LIVE_SESSIONS:
        raise JoinRefused(429, "too_many_sessions", f"agent token “{token.name}” already has "
                                                    f"{settings.AGENT_TOKEN_MAX_LIVE_SESSIONS} agents training; stop one, or "
                                                    "wait 2 minutes after one stopped")
    if live.filter(user_id=token.user_id).count() >= settings.VOLUNTEER_MAX_LIVE_SESSIONS:
        raise JoinRefused(429, "too_many_sessions", f"you already have {settings.VOLUNTEER_MAX_LIVE_SESSIONS} agents "
                                                    "training; stop one, or wait 2 minutes after one stopped")


def micro_batch_size_of(*, run: Run, request: JoinRequest) -> int:
    """The session's micro-batch size: the agent's declared override, if the run allows it, or the run's."""
    training = run.configuration.training
    declared = request.per_device_batch_size
    if declared is None:
        return training.per_device_batch_size
    limit = training.target_batch_size // training.gradient_accumulation_steps
    if declared > limit:  # valid in itself: it conflicts with the run's configuration (as the run's state does)
        raise JoinRefused(409, "batch_size_too_large", f"per_device_batch_size {declared} is more than this run "
                                                       f"allows a peer ({limit}: the target batch over the "
                                                       f"accumulation steps)")
    return declared


@transaction.atomic
def session_open(*, run: Run, token: AgentToken, request: JoinRequest) -> tuple[TrainingSession, dict]:
    """Open a training session for the token's owner and sign its first hivemind access token."""
    refusal = (agent_version_refusal(request.agent_version) or run_join_refusal(run=run, user=token.user)
               or run_role_refusal(run=run, user=token.user, role=request.role))
    if refusal:
        raise refusal
    _key_proof_check(run=run, request=request)
    micro_batch_size = micro_batch_size_of(run=run, request=request)
    if not run.coordinator_alive(timezone.now()) or not run.initial_peers:
        # Its last addresses would name a dead peer, and the agent's DHT cannot start without one alive.
        raise JoinRefused(503, "coordinator_unavailable", f"the coordinator of run “{run.slug}” is not reachable now; "
                                                          f"the agent will retry every {COORDINATOR_RETRY_SECONDS} s",
                          retry_after=COORDINATOR_RETRY_SECONDS)
    if request.replaces_session is not None:
        # A machine that restarted (a notebook's kernel killed, a preempted VM) joins as a new session: the one it
        # replaces ends when it was last seen, rather than counting as a second live machine for
        # LIVE_SESSION_SEEN_WITHIN. Only a session of the same token and run: a volunteer ends their own machine.
        TrainingSession.objects.filter(pk=request.replaces_session, token=token, run=run, ended_at=None).update(
            ended_at=F("last_seen_at"))
    _live_sessions_check(token=token)
    # One live session per peer key in a run: the monitor credits a session with what its key's
    # signed records announce. Locked so that two joins with one key cannot both pass.
    live = TrainingSession.objects.select_for_update().filter(run=run, peer_public_key=request.peer_public_key,
                                                               ended_at=None)
    if live.exists():
        raise JoinRefused(409, "peer_key_in_use", "a live training session of this run already uses this peer key; "
                                                  "each agent generates a key of its own when it joins")
    access, expires_at = _access_token(run=run, user=token.user, peer_public_key=request.peer_public_key,
                                       role=request.role)
    session = TrainingSession.objects.create(
        run=run,
        role=request.role,
        user=token.user,
        token=token,
        peer_public_key=request.peer_public_key,
        agent_version=request.agent_version,
        device=request.device.model_dump(mode="json"),
        access_expires_at=expires_at,
        micro_batch_size=micro_batch_size,
    )
    return session, access


@transaction.atomic
def session_refresh(*, session: TrainingSession, token: AgentToken) -> dict:
    """A fresh access token for a live session; refused once the volunteer is banned or the run stops."""
    if session.user_id != token.user_id:
        raise JoinRefused(404, "not_found", "no such session")
    if session.ended_at is not None:
        raise JoinRefused(409, "session_ended", "this training session has ended; join the run again")
    refusal = run_join_refusal(run=session.run, user=token.user) or run_role_refusal(
        run=session.run, user=token.user, role=session.role)
    if refusal:
        raise refusal
    access, expires_at = _access_token(run=session.run, user=token.user, peer_public_key=session.peer_public_key,
                                       role=session.role)
    TrainingSession.objects.filter(pk=session.pk).update(access_expires_at=expires_at, last_seen_at=timezone.now())
    return access


# Signed links that let a session's agent fetch one of its run's files without its token (the data
# stream and the checkpoint download go through libraries that cannot send headers): per kind, the
# signing salt, the run's related files and what a refused link says.
_SESSION_LINKS = {
    "data": (_FILE_SIGNER_SALT, "data_files", "this data link is not valid; the agent gets fresh links when it joins"),
    "checkpoint": (_CHECKPOINT_SIGNER_SALT, "checkpoints", "this checkpoint link is not valid, or a newer checkpoint "
                                                           "replaced it; the agent gets a fresh link when it joins"),
}


def session_link_token(*, session: TrainingSession, kind: str, target: DataFile | Checkpoint) -> str:
    """An unguessable path component that lets the session's agent fetch ``target`` (of ``kind``)."""
    salt, _, _ = _SESSION_LINKS[kind]
    return signing.dumps({"s": session.pk, "o": target.pk}, salt=salt, compress=True)


def session_link_target(*, url_token: str, kind: str) -> DataFile | Checkpoint:
    """The file behind a signed link while its session may still train in the run; else JoinRefused."""
    salt, related, invalid = _SESSION_LINKS[kind]
    try:
        payload = signing.loads(url_token, salt=salt, max_age=settings.DATA_URL_MAX_AGE_SECONDS)
        session = TrainingSession.objects.select_related("run", "user").get(pk=payload["s"])
        target = getattr(session.run, related).get(pk=payload["o"])
    except (signing.BadSignature, KeyError, TypeError, ObjectDoesNotExist):
        raise JoinRefused(404, "not_found", invalid) from None
    refusal = run_join_refusal(run=session.run, user=session.user)
    if refusal and refusal.code != "run_paused":
        raise refusal
    return target


def sessions_close_silent(*, silent_for: datetime.timedelta) -> int:
    """End the sessions whose agent has not been heard from for ``silent_for`` (a crash, a lost
    network): they end when they were last seen. Returns how many were closed.

    An aggregator sends no reports: its only word is the refresh of its access, which hivemind asks for as
    the access nears its end (HIVEMIND_ACCESS_MINUTES), so an aggregator is silent for longer than
    ``silent_for`` between two; closed, it was refused its next refresh and stopped (docs/benchmarks.md section
    28: at 1,221 s). It is alive while its access lasts, and silent once that ran out unrefreshed."""
    now = timezone.now()
    return TrainingSession.objects.filter(ended_at=None, last_seen_at__lt=now - silent_for).exclude(
        role=TrainingSession.Role.AGGREGATOR, access_expires_at__gt=now).update(ended_at=F("last_seen_at"))
