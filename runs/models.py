import secrets

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone


def _hivemind_run_id() -> str:
    # The prefix of every DHT key of the run; unique so that two runs never share records.
    return f"dlp-{secrets.token_hex(6)}"


class Run(models.Model):
    """A collaborative training run that volunteers join with the peer agent."""

    class Status(models.TextChoices):
        DRAFT = "draft"
        ACTIVE = "active"
        PAUSED = "paused"
        FINISHED = "finished"

    class Visibility(models.TextChoices):
        PUBLIC = "public", "Public: listed, anyone may join"
        UNLISTED = "unlisted", "Unlisted: anyone with the link may join"
        INVITE = "invite", "Invite only: a join code is needed"
        ALLOWLIST = "allowlist", "Allowlist: only the listed usernames may join"

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True, max_length=10000)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.PUBLIC)
    organizers = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="organized_runs")
    hivemind_run_id = models.CharField(max_length=32, unique=True, default=_hivemind_run_id, editable=False)
    config = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("run-detail", args=[self.slug])
