"""Training sessions: one agent process in one run, from join to its last report (runs/access/sessions.py)."""


from django.conf import settings
from django.db import models
from django.utils import timezone

from runs.models.setup import Run


class TrainingSession(models.Model):
    """One agent process in one run, from join to its last report; its peer key names it in the DHT."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="sessions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="training_sessions")
    token = models.ForeignKey("accounts.AgentToken", null=True, on_delete=models.SET_NULL, related_name="sessions")
    class Role(models.TextChoices):
        TRAINER = "trainer", "trainer"
        AGGREGATOR = "aggregator", "aggregator"  # averages only: reports no samples, earns no credit

    peer_public_key = models.TextField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.TRAINER)
    micro_batch_size = models.PositiveIntegerField(null=True, blank=True, help_text=(
        "Samples per micro-batch of the agent, fixed at join: its --per-device-batch-size, or the run's then. "
        "Its commitments must use it; the checks' per-step allowances follow it (empty: the run's)."))
    agent_version = models.CharField(max_length=64)
    device = models.JSONField(default=dict)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    access_expires_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True, help_text=(
        "When spot checks suspended the session (its reports are refused); an organizer can lift it."))
    suspension_reason = models.CharField(max_length=500, blank=True)
    states_served = models.PositiveIntegerField(default=0, help_text=(
        "States of the swarm the validator downloaded from the session's peer (runs/swarm/spotcheck.py)."))
    states_disagreed = models.PositiveIntegerField(default=0, help_text=(
        "Of those, states unlike any two peers agreed on for their epoch: its own parameters served as the "
        "swarm's, or an averaging round it missed."))
    validator_worker = models.CharField(max_length=255, blank=True, help_text=(
        "The validator worker that checks the session's commitments (runs/swarm/recompute.py): it keeps the "
        "session's data stream where its last check left it."))
    validator_worker_seen_at = models.DateTimeField(null=True, blank=True, help_text=(
        "When that worker last took one of the session's checks."))

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["run", "peer_public_key"])]
