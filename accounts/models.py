import secrets

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


def _pseudonym() -> str:
    return f"volunteer-{secrets.token_hex(4)}"


class User(AbstractUser):
    """A person with an account: a volunteer, and an organizer once staff grant the permission."""

    class Visibility(models.TextChoices):
        PUBLIC = "public", _("Public: show my display name")
        ANONYMOUS = "anonymous", _("Anonymous: show a stable pseudonym")
        HIDDEN = "hidden", _("Hidden: leave me off public boards")

    email = models.EmailField(_("e-mail address"), unique=True)
    display_name = models.CharField(max_length=64, blank=True, help_text=_("Shown on leaderboards instead of your username."))
    visibility = models.CharField(
        max_length=16,
        choices=Visibility.choices,
        default=Visibility.PUBLIC,
        help_text=_("How you appear on leaderboards, team pages and public exports."),
    )
    pseudonym = models.CharField(max_length=32, unique=True, default=_pseudonym, editable=False)
    team = models.ForeignKey("Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="members")

    class Meta:
        permissions = [("organize_runs", "Can create and organize training runs")]

    @property
    def public_name(self) -> str | None:
        """The name others may see, or None when the volunteer asked to be hidden."""
        if self.visibility == self.Visibility.HIDDEN:
            return None
        if self.visibility == self.Visibility.ANONYMOUS:
            return self.pseudonym
        return self.display_name or self.username

    @property
    def is_organizer(self) -> bool:
        return self.has_perm("accounts.organize_runs")


class Team(models.Model):
    name = models.CharField(max_length=64, unique=True)
    slug = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True, max_length=2000)
    founder = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    disbanded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("team-detail", args=[self.slug])

    @property
    def is_active(self) -> bool:
        return self.disbanded_at is None


class TeamEvent(models.Model):
    """Append-only history of a team's membership, so a takeover can always be traced."""

    class Kind(models.TextChoices):
        FOUNDED = "founded", _("Founded")
        JOINED = "joined", _("Joined")
        LEFT = "left", _("Left")
        HANDED_OVER = "handed_over", _("handed over")
        DISBANDED = "disbanded", _("Disbanded")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="events")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]


class AgentToken(models.Model):
    """A volunteer's secret for one machine. Only a SHA-256 digest of the secret is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_tokens")
    name = models.CharField(max_length=64, help_text="Which machine this token is for, e.g. “home desktop”.")
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+", help_text="Limit the token to one run."
    )
    prefix = models.CharField(max_length=12, help_text="The first characters of the secret, to recognise it.")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_ip = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def state(self) -> str:
        if self.revoked_at:
            return "revoked"
        return "expired" if self.is_expired else "active"
