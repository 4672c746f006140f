"""A run and its setup: its settings, backbone peers, lifecycle events, members, bans and data files."""

import datetime
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from peer_agent.protocol import RunConfig


def _hivemind_run_id() -> str:
    # The prefix of every DHT key of the run; unique so that two runs never share records.
    return f"dlp-{secrets.token_hex(6)}"


def _join_code() -> str:
    return secrets.token_urlsafe(9)


class ModelLicense(models.TextChoices):
    """Common licenses, by their Hugging Face Hub identifiers (a model card's ``license:``)."""

    APACHE = "apache-2.0", "Apache 2.0"
    MIT = "mit", "MIT"
    CC_BY = "cc-by-4.0", "CC BY 4.0"
    CC_BY_SA = "cc-by-sa-4.0", "CC BY-SA 4.0"
    CC_BY_NC = "cc-by-nc-4.0", "CC BY-NC 4.0"
    GPL = "gpl-3.0", "GPL 3.0"
    OPENRAIL = "openrail", "OpenRAIL"
    OTHER = "other", "Other"


class Run(models.Model):
    """A collaborative training run that volunteers join with the peer agent."""

    class Status(models.TextChoices):
        DRAFT = "draft", _("Draft")
        ACTIVE = "active", _("Active")
        PAUSED = "paused", _("Paused")
        FINISHED = "finished", _("Finished")

    class Visibility(models.TextChoices):
        PUBLIC = "public", _("Public: listed, anyone may join")
        UNLISTED = "unlisted", _("Unlisted: anyone with the link may join")
        INVITE = "invite", _("Invite only: a join code is needed")
        ALLOWLIST = "allowlist", _("Allowlist: only the listed usernames may join")

    class Audience(models.TextChoices):
        EVERYONE = "everyone", _("Everyone: the run, its boards and charts are public (listed if the run is public)")
        MEMBERS = "members", _("Members only: invisible to everyone but its organizers and those who may train in it")

    class TokenizerStatus(models.TextChoices):
        MISSING = "missing", _("Missing")
        TRAINING = "training", _("Training")
        READY = "ready", _("Ready")
        FAILED = "failed", _("Failed")

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=64, unique=True, help_text="The run's address and the name agents join by.")
    description = models.TextField(blank=True, max_length=10000)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.PUBLIC,
                                  help_text="Who may join (and whether the run is listed).")
    audience = models.CharField(max_length=16, choices=Audience.choices, default=Audience.EVERYONE,
                                help_text="Who may see the run: its pages, API, live board, charts and profiles' mentions.")
    join_code = models.CharField(max_length=32, default=_join_code, help_text="Volunteers enter it to join an invite-only run.")
    allowlist = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="allowed_runs")
    organizers = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="organized_runs")
    hivemind_run_id = models.CharField(max_length=32, unique=True, default=_hivemind_run_id, editable=False)
    config = models.JSONField(default=dict)
    authority_public_key = models.TextField(editable=False)
    authority_private_key = models.BinaryField(editable=False, help_text="Encrypted with AUTHORITY_ENCRYPTION_KEY.")
    initial_peers = models.JSONField(default=list, blank=True, help_text="Multiaddrs of the run's backbone peers.")
    coordinator_peer_id = models.CharField(
        max_length=100, blank=True, help_text="The backbone peer holding the run's duties (monitor, checkpoints, spot checks).")
    duties_until = models.DateTimeField(null=True, blank=True,
                                        help_text="When that peer's hold on the duties lapses unless it renews it.")
    coordinator_heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="The latest heartbeat of any backbone peer.")
    tokenizer_status = models.CharField(max_length=16, choices=TokenizerStatus.choices, default=TokenizerStatus.MISSING)
    tokenizer_file = models.FileField(upload_to="tokenizers/", blank=True)
    tokenizer_error = models.TextField(blank=True)
    license = models.CharField(max_length=32, choices=ModelLicense.choices, default=ModelLicense.APACHE,
                               help_text="The license of the model it releases, for its model card.")
    languages = models.JSONField(default=list, blank=True, help_text="ISO 639-1 codes of the languages it learns (model card).")
    probe_every = models.PositiveSmallIntegerField(default=1, help_text="Run the downstream probes on every n-th checkpoint.")
    heldout_size = models.PositiveIntegerField(
        default=200, validators=[MinValueValidator(10), MaxValueValidator(100_000)],
        help_text="Documents kept apart from the uploaded files to evaluate checkpoints on (files source), or "
                  "documents read from the hub sources: those held out by hash, or of the validation split.")
    validation_split = models.CharField(
        max_length=100, default="validation",
        help_text="The hub sources' split that checkpoints are evaluated on when held out by validation split; "
                  "never the split agents train on.")
    class SourcesCheck(models.TextChoices):
        UNCHECKED = "unchecked", _("Not checked")
        CHECKING = "checking", _("Checking")
        PASSED = "passed", _("Loads")
        FAILED = "failed", _("Does not load")

    sources_check = models.CharField(
        max_length=16, choices=SourcesCheck.choices, default=SourcesCheck.UNCHECKED,
        help_text="Whether the worker could resolve the hub sources (configuration, splits, text column) as saved.")
    sources_error = models.TextField(blank=True, help_text="What keeps the hub sources from loading, for the organizers.")
    heldout_file = models.FileField(upload_to="heldout/", blank=True, help_text=(
        "The documents kept apart from the uploaded files: no agent is ever sent them."))
    heldout_documents = models.PositiveIntegerField(default=0, help_text="Documents in heldout_file.")
    started_from = models.CharField(max_length=300, blank=True, help_text=(
        "What the run's initial weights and tokenizer come from: another run's checkpoint (slug@epoch), a "
        "folder under START_MODELS_DIR or a Hugging Face model id; it is the run's checkpoint of epoch 0. "
        "Empty: random weights (runs/setup/start.py)."))
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("run-detail", args=[self.slug])

    @property
    def configuration(self) -> RunConfig:
        """The run's configuration (``config``) as the contract types it, parsed once per ``config`` it
        holds: a new ``config`` (a save of new settings, a refresh from the database) is parsed anew."""
        parsed = self.__dict__.get("_configuration")
        if parsed is None or parsed[0] is not self.config:
            parsed = self.__dict__["_configuration"] = (self.config, RunConfig.model_validate(self.config or {}))
        return parsed[1]

    def coordinator_alive(self, now: datetime.datetime) -> bool:
        """Whether the run's coordinator has beaten recently enough for its backbone peers to be up."""
        if self.coordinator_heartbeat_at is None:
            return False
        return (now - self.coordinator_heartbeat_at).total_seconds() <= settings.COORDINATOR_HEARTBEAT_STALE_SECONDS


class Backbone(models.Model):
    """One backbone peer of a run, as its coordinator last said: a run may have several (on several
    hosts), all of them initial peers of every join, one of them holding the run's duties."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="backbones")
    peer_id = models.CharField(max_length=100)
    maddrs = models.JSONField(default=list, help_text="The multiaddrs it is reachable at.")
    host = models.CharField(max_length=255, help_text="The host its coordinator runs on.")
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    aggregates = models.BooleanField(default=False, help_text="It runs an aggregator in the run's gradient rounds.")
    aggregator_rounds = models.PositiveIntegerField(default=0, help_text="Gradient rounds its aggregator joined.")

    class Meta:
        ordering = ["started_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "peer_id"], name="one_row_per_backbone_peer")]

    def alive(self, now: datetime.datetime) -> bool:
        return (now - self.heartbeat_at).total_seconds() <= settings.COORDINATOR_HEARTBEAT_STALE_SECONDS


class RunEvent(models.Model):
    """The run's audit log: every lifecycle change, config edit and moderation, with who and when."""

    class Kind(models.TextChoices):
        CREATED = "created", _("Created")
        ACTIVATED = "activated", _("Activated")
        PAUSED = "paused", _("Paused")
        RESUMED = "resumed", _("Resumed")
        FINISHED = "finished", _("Finished")
        RESTARTED = "restarted", _("Restarted from its last checkpoint")
        CONFIG_CHANGED = "config_changed", _("configuration changed")
        BANNED = "banned", _("Banned")
        UNBANNED = "unbanned", _("Unbanned")
        TOKENIZER = "tokenizer", _("tokenizer changed")
        DATA = "data", _("data changed")
        CREDIT_ACCEPTED = "credit_accepted", _("flagged credit accepted")
        CREDIT_REJECTED = "credit_rejected", _("flagged credit rejected")
        SUSPENDED = "suspended", _("session suspended by spot checks")
        UNSUSPENDED = "unsuspended", _("session suspension lifted")

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    detail = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]


class RunMembership(models.Model):
    """A volunteer who entered an invite-only run's join code."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_memberships")
    joined_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user"], name="one_membership_per_run")]


class RunBan(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="bans")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_bans")
    banned_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user"], name="one_ban_per_run")]


class DataFile(models.Model):
    """A UTF-8 text file an organizer uploaded; the portal serves it to the run's agents."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="data_files")
    file = models.FileField(upload_to="data/")
    name = models.CharField(max_length=200)
    size = models.PositiveBigIntegerField()
    lines = models.PositiveBigIntegerField()
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    uploaded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["uploaded_at", "id"]
