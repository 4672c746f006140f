"""Reads for volunteers, teams and agent tokens."""

from django.db.models import QuerySet

from accounts.models import AgentToken, Notification, Team, TeamEvent, User


def volunteer_public_profile(*, token: AgentToken) -> dict:
    user = token.user
    return {
        "username": user.username,
        "public_name": user.public_name,
        "visibility": user.visibility,
        "team": {"name": user.team.name, "slug": user.team.slug} if user.team else None,
        "token_name": token.name,
        "token_run": token.run.slug if token.run else None,
        "token_expires_at": token.expires_at.isoformat(),
    }


def team_list() -> QuerySet[Team]:
    return Team.objects.filter(disbanded_at=None).select_related("founder")


def team_members(*, team: Team) -> QuerySet[User]:
    return team.members.order_by("username")


def team_history(*, team: Team) -> QuerySet[TeamEvent]:
    return team.events.select_related("user")


def token_list(*, user: User) -> QuerySet[AgentToken]:
    return user.agent_tokens.select_related("run")


def notification_list(*, user: User) -> QuerySet[Notification]:
    return Notification.objects.filter(user=user)


def notification_unread_count(*, user: User) -> int:
    return Notification.objects.filter(user=user, read_at=None).count()
