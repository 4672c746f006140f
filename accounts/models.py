import datetime
import secrets

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from accounts.names import name_check_visible, name_skeleton


def _pseudonym() -> str:
    # 48 random bits: with 32, a portal of 100,000 volunteers drew two alike more often than not.
    return f"volunteer-{secrets.token_hex(6)}"


class User(AbstractUser):
    """A person with an account: a volunteer, and an organizer once staff grant the permission."""

    class Visibility(models.TextChoices):
        PUBLIC = "public", _("Public: show my display name")
        ANONYMOUS = "anonymous", _("Anonymous: show a stable pseudonym")
        HIDDEN = "hidden", _("Hidden: leave me off public boards")

    email = models.EmailField(_("e-mail address"), unique=True)
    display_name = models.CharField(max_length=64, blank=True, validators=[name_check_visible],
                                    help_text=_("Shown on leaderboards instead of your username."))
    # TR39 skeletons of the two names (accounts/names.py), kept so that a look-alike is one
    # indexed query away; save() keeps them in step with the names.
    username_skeleton = models.TextField(db_index=True, editable=False, default="")
    display_name_skeleton = models.TextField(db_index=True, editable=False, default="")
    visibility = models.CharField(
        max_length=16,
        choices=Visibility.choices,
        default=Visibility.PUBLIC,
        help_text=_("How you appear on leaderboards, team pages and public exports."),
    )
    pseudonym = models.CharField(max_length=32, unique=True, default=_pseudonym, editable=False)
    team = models.ForeignKey("Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="members")
    # None until the volunteer opens the link mailed to `email`; a new address is unverified again.
    email_verified_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The language of the e-mails the portal sends: the switcher's choice of the moment this was saved.
    language = models.CharField(_("language of e-mails"), max_length=8, choices=settings.LANGUAGES,
                                default=settings.LANGUAGE_CODE)
    # Notification kinds (Notification.Kind) the volunteer asked not to be e-mailed about.
    email_opt_outs = models.JSONField(default=list, blank=True)

    class Meta:
        permissions = [("organize_runs", "Can create and organize training runs")]

    def save(self, *args, **kwargs) -> None:
        self.username_skeleton = name_skeleton(self.username)
        self.display_name_skeleton = name_skeleton(self.display_name) if self.display_name else ""
        kwargs["update_fields"] = _with_skeletons(kwargs.get("update_fields"), {"username", "display_name"},
                                                  {"username_skeleton", "display_name_skeleton"})
        super().save(*args, **kwargs)

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

    @property
    def email_verified(self) -> bool:
        return self.email_verified_at is not None


def _with_skeletons(update_fields, names: set[str], skeletons: set[str]):
    """`update_fields` widened by the skeletons, when a save writes a name they are taken from."""
    if update_fields is None or not names & set(update_fields):
        return update_fields
    return {*update_fields, *skeletons}


class Team(models.Model):
    name = models.CharField(max_length=64, unique=True, validators=[name_check_visible])
    name_skeleton = models.TextField(db_index=True, editable=False, default="")
    slug = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True, max_length=2000)
    founder = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    disbanded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        self.name_skeleton = name_skeleton(self.name)
        kwargs["update_fields"] = _with_skeletons(kwargs.get("update_fields"), {"name"}, {"name_skeleton"})
        super().save(*args, **kwargs)

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


class Notification(models.Model):
    """Something that happened to a volunteer, shown by the bell and perhaps e-mailed.

    `key` names the event (e.g. `run-event:42`); one row per (user, kind, key) is the idempotency
    guard: a task that runs twice for one event finds the row and sends nothing new.
    """

    class Kind(models.TextChoices):
        TOKEN_EXPIRING = "token_expiring", _("An agent token of mine expires within 7 days")
        RUN_PAUSED = "run_paused", _("A run I train for is paused")
        RUN_RESUMED = "run_resumed", _("A run I train for is resumed")
        RUN_FINISHED = "run_finished", _("A run I train for is finished")
        CREDIT_FLAGGED = "credit_flagged", _("My credit is flagged for an organizer's review")
        CREDIT_DECIDED = "credit_decided", _("An organizer decides on my flagged credit")
        SESSION_SUSPENDED = "session_suspended", _("Spot checks suspend a training session of mine")
        MILESTONE = "milestone", _("I reach a milestone")

    class Email(models.TextChoices):
        PENDING = "pending", _("waiting to be sent")
        SENDING = "sending", _("being sent")
        SENT = "sent", _("sent")
        OPTED_OUT = "opted_out", _("not sent: you opted out")
        THROTTLED = "throttled", _("not sent: too many e-mails this hour")
        UNVERIFIED = "unverified", _("not sent: address not verified")

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    key = models.CharField(max_length=200)
    context = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)
    email_state = models.CharField(max_length=16, choices=Email.choices, default=Email.PENDING)
    # When the e-mail was claimed for sending: what the hourly throttle counts.
    emailed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "kind", "key"], name="notification_once_per_event")]
        indexes = [models.Index(fields=["user", "read_at"], name="notification_unread"),
                   models.Index(fields=["user", "emailed_at"], name="notification_emailed")]


class PendingSignUp(models.Model):
    """A sign-up waiting for its address to be confirmed (accounts/signup.py). No account exists
    until the mailed link is opened, so the sign-up page never tells whether an address has one."""

    username = models.CharField(max_length=150)
    email = models.EmailField()
    password = models.CharField(max_length=128)  # hashed by make_password, as User.password is
    language = models.CharField(max_length=8, choices=settings.LANGUAGES, default=settings.LANGUAGE_CODE)
    # SHA-256 of the link's secret, written by the task that mails the link; the secret is never stored.
    token_digest = models.CharField(max_length=64, blank=True, db_index=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return self.username

    @property
    def expires_at(self) -> datetime.datetime:
        return self.created_at + datetime.timedelta(days=settings.EMAIL_VERIFICATION_DAYS)
