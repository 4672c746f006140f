"""What the coordinator records of a run's swarm: the monitor's readings and checkpoints (runs/swarm/)."""

import re
from pathlib import Path

from django.db import models
from django.utils import timezone

from runs.models.setup import Run


class RunSample(models.Model):
    """The monitor's reading of a run's swarm at one moment: the series behind the run's charts,
    its health page and the live snapshot."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(default=timezone.now)
    global_epoch = models.PositiveIntegerField()
    samples_per_second = models.FloatField()
    alive_peers = models.PositiveIntegerField()
    client_peers = models.PositiveIntegerField(default=0)
    samples_accumulated = models.PositiveBigIntegerField(default=0, help_text="Samples toward the next epoch.")
    loss = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["run", "at"]
        indexes = [models.Index(fields=["run", "at"])]


class Checkpoint(models.Model):
    """The collaboration's state saved by the coordinator: a zip of a Hugging Face model directory
    (``save_pretrained`` of model and tokenizer) with the optimizer state and metadata."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    epoch = models.PositiveIntegerField()
    loss = models.FloatField(null=True, blank=True)
    samples = models.PositiveBigIntegerField(default=0, help_text="Samples the collaboration had processed.")
    file = models.FileField(upload_to="checkpoints/")
    size = models.PositiveBigIntegerField(default=0)
    kept = models.BooleanField(default=False, help_text="Kept for good (every n-th), beyond the recent ones.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-epoch", "-id"]
        constraints = [models.UniqueConstraint(fields=["run", "epoch"], name="one_checkpoint_per_epoch")]

    @property
    def number(self) -> int:
        """The checkpoint's sequence number in its run (1 for the first ever saved).

        It lives in the file name, since retention deletes rows and a count of rows would repeat numbers.
        """
        match = re.match(r"^(\d+)-epoch", Path(self.file.name).name)
        return int(match.group(1)) if match else 0
