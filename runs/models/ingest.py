"""What agents send, as stored: contribution reports, signed step commitments and refused reports
(runs/ingest/reports.py)."""


from django.db import models
from django.utils import timezone

from runs.models.access import TrainingSession


class ContributionEvent(models.Model):
    """One acknowledged report of an agent: append-only, unique per (session, seq) so that a
    resent report is never counted twice. Aggregates are computed from these in batches."""

    session = models.ForeignKey(TrainingSession, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    samples = models.PositiveIntegerField()
    steps = models.PositiveIntegerField()
    local_epoch = models.PositiveIntegerField()
    loss = models.FloatField(null=True)
    samples_per_second = models.FloatField()
    sent_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="one_event_per_report")]
        indexes = [models.Index(fields=["received_at"])]


class StepCommitment(models.Model):
    """The steps one session committed to for one epoch (peer_agent.protocol.EpochCommitment, signed
    with its peer key), and the spot check of them. The first commitment for an epoch stands."""

    class Outcome(models.TextChoices):
        PENDING = "pending"  # not checked yet
        PASSED = "passed"  # every recomputed step matched its fingerprint
        FAILED = "failed"  # a recomputed step did not
        UNCHECKED = "unchecked"  # the validator held no state of the epoch: it can never be checked
        # A recomputed step did not match, but the session had computed it at parameters other than the
        # held state's (its averaging round had failed): it cannot be checked, and earns nothing.
        DIVERGED = "diverged"

    session = models.ForeignKey(TrainingSession, on_delete=models.CASCADE, related_name="commitments")
    epoch = models.PositiveIntegerField()
    micro_batch_size = models.PositiveIntegerField()
    shuffle_buffer = models.PositiveIntegerField()
    steps = models.JSONField(help_text="[[cursor, samples, fingerprint(, parameters)], ...] in stream order.")
    samples = models.PositiveBigIntegerField(help_text="The committed steps' samples.")
    received_at = models.DateTimeField(default=timezone.now)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.PENDING)
    checked_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True, help_text="When its check was queued for a validator worker.")
    check_detail = models.CharField(max_length=500, blank=True)
    checked_steps = models.JSONField(default=list, blank=True, help_text="[[cursor, distance], ...] recomputed.")

    class Meta:
        ordering = ["session", "epoch"]
        constraints = [models.UniqueConstraint(fields=["session", "epoch"], name="one_commitment_per_session_epoch")]
        indexes = [models.Index(fields=["outcome"])]


class ReportRejection(models.Model):
    """A report the portal refused, kept for the run's organizers; it never earns credit."""

    session = models.ForeignKey(TrainingSession, null=True, on_delete=models.CASCADE, related_name="rejections")
    seq = models.PositiveIntegerField(null=True)
    code = models.CharField(max_length=64)
    detail = models.CharField(max_length=500)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
