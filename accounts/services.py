"""Writes for volunteers, teams and agent tokens."""

import datetime
import hashlib
import logging
import re
import secrets

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from accounts.models import AgentToken, Team, TeamEvent, User
from portal.ratelimit import rate_limit_check, rate_limit_hit

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "dlp_"
_TOKEN_SHAPE = re.compile(r"^dlp_[A-Za-z0-9_-]{43}$")
# Recording every use would turn each agent request into a write on one hot row.
_LAST_USED_RESOLUTION = datetime.timedelta(seconds=60)


class TeamError(Exception):
    """A team action that is not allowed; the message is meant for the person who tried it."""


class AgentTokenRefused(Exception):
    """An agent token that cannot be used; `code` and `status` go into the API error."""

    def __init__(self, code: str, detail: str, status: int = 401, token_id: int | None = None) -> None:
        super().__init__(detail)
        self.code, self.detail, self.status, self.token_id = code, detail, status, token_id


def token_digest(secret: str) -> str:
    # The secret carries 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


class EmailUnverified(Exception):
    """Agent tokens wait for a confirmed address (ACCOUNT_EMAIL_VERIFICATION_REQUIRED)."""


def token_create(*, user: User, name: str, run=None, lifetime: datetime.timedelta | None = None) -> tuple[AgentToken, str]:
    """Create a token and return it with its secret, which is never stored and shown only now."""
    token, secret = token_new(user=user, name=name, run=run, lifetime=lifetime)
    token.save()
    return token, secret


def token_new(*, user: User, name: str, run=None, lifetime: datetime.timedelta | None = None) -> tuple[AgentToken, str]:
    """An unsaved token and its secret: `token_create` saves one, a setup of thousands saves them in one
    `bulk_create` (bench/ingest.py)."""
    if settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED and not user.email_verified:
        # A throwaway address cannot train (and collect credit) in bulk: each account needs a mailbox.
        raise EmailUnverified(f"{user.username} has not confirmed their e-mail address yet")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    lifetime = lifetime or datetime.timedelta(days=settings.AGENT_TOKEN_DEFAULT_DAYS)
    token = AgentToken(
        user=user,
        name=name,
        run=run,
        prefix=secret[: len(TOKEN_PREFIX) + 4],
        digest=token_digest(secret),
        expires_at=timezone.now() + lifetime,
    )
    return token, secret


def token_revoke(*, token: AgentToken) -> None:
    if token.revoked_at is None:
        AgentToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now())
        token.refresh_from_db(fields=["revoked_at"])


def token_authenticate(*, secret: str | None, ip: str | None, run=None) -> AgentToken:
    """Return the usable token behind `secret`, recording its use, or raise AgentTokenRefused.

    Refusals of a presented secret are logged and counted per client address; an address past
    `RATE_LIMITS["token_failures"]` gets RateLimited for every token until its window ends.
    """
    if not secret:
        raise AgentTokenRefused("token_missing", "send your agent token as 'Authorization: Bearer dlp_…'")
    address = ip or "unknown"
    rate_limit_check(name="token_failures", key=address)
    try:
        token = _token_usable(secret)
    except AgentTokenRefused as refusal:
        # The code and the token's id only: the secret, even a wrong one, never goes into a log.
        logger.warning("agent token refused: %s from %s%s", refusal.code, address,
                       f" (token {refusal.token_id})" if refusal.token_id else "")
        rate_limit_hit(name="token_failures", key=address)
        raise
    if not token.user.is_active:
        raise AgentTokenRefused("account_disabled", "the account that owns this token is disabled", status=403)
    if run is not None:
        token_check_scope(token=token, run=run)
    _token_mark_used(token=token, ip=ip)
    return token


def _token_usable(secret: str) -> AgentToken:
    """The token behind `secret` if it exists and is neither revoked nor expired."""
    if not _TOKEN_SHAPE.match(secret):
        raise AgentTokenRefused("token_malformed", "this is not an agent token; copy it again from your tokens page")
    token = AgentToken.objects.select_related("user", "run").filter(digest=token_digest(secret)).first()
    if token is None:
        raise AgentTokenRefused("token_unknown", "this agent token does not exist; create one on your tokens page")
    if token.revoked_at:
        raise AgentTokenRefused("token_revoked", f"agent token “{token.name}” was revoked; create a new one",
                                token_id=token.pk)
    if token.is_expired:
        raise AgentTokenRefused("token_expired", f"agent token “{token.name}” expired; create a new one",
                                token_id=token.pk)
    return token


def token_check_scope(*, token: AgentToken, run) -> None:
    """Refuse a token limited to another run than `run`."""
    if token.run_id is not None and token.run_id != run.pk:
        raise AgentTokenRefused(
            "token_out_of_scope", f"agent token “{token.name}” is limited to run “{token.run.slug}”", status=403
        )


def _token_mark_used(*, token: AgentToken, ip: str | None) -> None:
    now = timezone.now()
    if token.last_used_at and now - token.last_used_at < _LAST_USED_RESOLUTION and token.last_used_ip == ip:
        return
    AgentToken.objects.filter(pk=token.pk).update(last_used_at=now, last_used_ip=ip)
    token.last_used_at, token.last_used_ip = now, ip


def _team_event(team: Team, user: User, kind: str) -> None:
    TeamEvent.objects.create(team=team, user=user, kind=kind)


@transaction.atomic
def team_create(*, founder: User, name: str, description: str = "") -> Team:
    if founder.team_id and founder.team.founder_id == founder.pk:
        raise TeamError(_("you founded “%(team)s”; hand it over or disband it before founding another")
                        % {"team": founder.team.name})
    slug = slugify(name)[:64] or f"team-{secrets.token_hex(3)}"
    if Team.objects.filter(slug=slug).exists():
        slug = f"{slug[:57]}-{secrets.token_hex(3)}"
    team = Team.objects.create(name=name, slug=slug, description=description, founder=founder)
    _team_event(team, founder, TeamEvent.Kind.FOUNDED)
    team_join(user=founder, team=team)
    return team


@transaction.atomic
def team_join(*, user: User, team: Team) -> None:
    if not team.is_active:
        raise TeamError(_("“%(team)s” was disbanded") % {"team": team.name})
    if user.team_id == team.pk:
        return
    if user.team_id:
        team_leave(user=user)
    user.team = team
    user.save(update_fields=["team"])
    _team_event(team, user, TeamEvent.Kind.JOINED)


@transaction.atomic
def team_leave(*, user: User) -> None:
    team = user.team
    if team is None:
        raise TeamError(_("you are not in a team"))
    if team.founder_id == user.pk:
        raise TeamError(_("you founded “%(team)s”; hand it over to another member or disband it first")
                        % {"team": team.name})
    user.team = None
    user.save(update_fields=["team"])
    _team_event(team, user, TeamEvent.Kind.LEFT)


@transaction.atomic
def team_hand_over(*, team: Team, founder: User, successor: User) -> None:
    if team.founder_id != founder.pk:
        raise TeamError(_("only the founder can hand the team over"))
    if successor.team_id != team.pk or successor.pk == founder.pk:
        raise TeamError(_("%(name)s is not another member of “%(team)s”") % {"name": successor.username, "team": team.name})
    team.founder = successor
    team.save(update_fields=["founder"])
    _team_event(team, successor, TeamEvent.Kind.HANDED_OVER)


@transaction.atomic
def team_disband(*, team: Team, founder: User) -> None:
    if team.founder_id != founder.pk:
        raise TeamError(_("only the founder can disband the team"))
    for member in team.members.all():
        member.team = None
        member.save(update_fields=["team"])
        _team_event(team, member, TeamEvent.Kind.LEFT)
    team.disbanded_at = timezone.now()
    team.save(update_fields=["disbanded_at"])
    _team_event(team, founder, TeamEvent.Kind.DISBANDED)
