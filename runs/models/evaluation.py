"""Held-out evaluations and downstream probes of a run's checkpoints (runs/evaluation/)."""


from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from runs.models.setup import Run
from runs.models.swarm import Checkpoint


class Probe(models.Model):
    """A labelled set an organizer uploaded to measure what the model learned: each probed
    checkpoint, and once a randomly initialized model of the same shape, is fine-tuned on its train
    part with a fixed budget (runs/swarm/probing.py) and scored on its test part."""

    class Task(models.TextChoices):
        TOKENS = "tokens", _("Token classification (CoNLL/WikiANN lines)")
        TEXT = "text", _("Text classification (CSV text,label)")

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="probes")
    name = models.CharField(max_length=100)
    task = models.CharField(max_length=16, choices=Task.choices)
    labels = models.JSONField(default=list, help_text="The train part's labels, sorted.")
    train_file = models.FileField(upload_to="probes/")
    test_file = models.FileField(upload_to="probes/")
    train_examples = models.PositiveIntegerField()
    test_examples = models.PositiveIntegerField()
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    uploaded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["uploaded_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_probe_name_per_run")]

    @property
    def metric(self) -> str:
        return "f1" if self.task == self.Task.TOKENS else "accuracy"


class ProbeScore(models.Model):
    """A probe's score after the fine-tune: of a checkpoint's epoch, or of the random-init baseline.
    It outlives the checkpoint (retention deletes most), so the run page keeps its history."""

    probe = models.ForeignKey(Probe, on_delete=models.CASCADE, related_name="scores")
    baseline = models.BooleanField(default=False, help_text="From a randomly initialized model, not a checkpoint.")
    checkpoint = models.ForeignKey(Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="probe_scores")
    epoch = models.PositiveIntegerField(null=True, blank=True)
    samples = models.PositiveBigIntegerField(default=0, help_text="Samples the collaboration had processed.")
    score = models.FloatField(help_text="Entity-level F1 (seqeval) or accuracy, 0 to 1: the mean over the seeds.")
    score_std = models.FloatField(null=True, blank=True, help_text="The scores' standard deviation over the seeds.")
    seeds = models.PositiveSmallIntegerField(default=1, help_text="Fine-tunes from different seeds the score averages.")
    wall_seconds = models.FloatField(default=0)
    cpu_seconds = models.FloatField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["probe", "baseline", "epoch"]
        constraints = [
            models.UniqueConstraint(fields=["probe", "epoch"], condition=models.Q(baseline=False),
                                    name="one_probe_score_per_epoch"),
            models.UniqueConstraint(fields=["probe"], condition=models.Q(baseline=True), name="one_probe_baseline"),
        ]


class Evaluation(models.Model):
    """A checkpoint's masked-LM and sentence-order scores on the run's held-out split, or (epoch
    null) those of a baseline, measured once per run: a randomly initialized model of the run's
    shape, and models that know only word frequencies (runs/evaluation/frequencies.py), which
    show what training added and whether it learnt more than how common each word is. Kept when
    retention deletes the checkpoint."""

    class Kind(models.TextChoices):
        CHECKPOINT = "checkpoint", "checkpoint"
        RANDOM_INIT = "random_init", "random init"
        UNIGRAM = "unigram", "word frequencies"
        BIGRAM = "bigram", "word-pair frequencies"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CHECKPOINT)
    checkpoint = models.ForeignKey(Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="evaluations")
    epoch = models.PositiveIntegerField(null=True, blank=True, help_text="The checkpoint's epoch; empty for a baseline.")
    samples = models.PositiveBigIntegerField(default=0, help_text="Samples the collaboration had processed.")
    tokens_seen = models.PositiveBigIntegerField(default=0, help_text="Samples × the run's tokens per example.")
    mlm_accuracy = models.FloatField(null=True, blank=True, help_text="Share of masked tokens predicted right.")
    perplexity = models.FloatField(null=True, blank=True, help_text="exp of the mean masked-LM loss per masked token.")
    sop_accuracy = models.FloatField(null=True, blank=True,
                                     help_text="Share of sentence pairs whose order was told right; empty for "
                                               "frequency baselines, which do not tell order.")
    examples = models.PositiveIntegerField(default=0, help_text="Held-out examples (sentence pairs) evaluated.")
    masked_tokens = models.PositiveIntegerField(default=0)
    cpu_seconds = models.FloatField(default=0, help_text="CPU time of the evaluating process.")
    wall_seconds = models.FloatField(default=0)
    error = models.CharField(max_length=2000, blank=True, help_text="Why the evaluation failed; it is not retried.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", models.F("epoch").asc(nulls_first=True), "kind"]  # the baselines first, on every database
        constraints = [
            models.UniqueConstraint(fields=["run", "epoch"], name="one_evaluation_per_epoch"),
            models.UniqueConstraint(fields=["run", "kind"], condition=models.Q(epoch=None), name="one_baseline_per_run_and_kind"),
            models.CheckConstraint(condition=models.Q(epoch=None) ^ models.Q(kind="checkpoint"),
                                   name="evaluation_epoch_iff_checkpoint"),
        ]

    @property
    def baseline(self) -> bool:
        return self.epoch is None
