import datetime
import re
import secrets
from pathlib import Path

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

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["run", "peer_public_key"])]


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


class SessionEpoch(models.Model):
    """What one session contributed to one collaboration epoch: the samples its agent reported
    (summed from its contribution events in batches) and the samples its signed DHT progress
    record announced (read by the coordinator's monitor). Credit is *provisional* until the
    monitor compares the two; only verified or accepted epochs earn verified credit."""

    class Status(models.TextChoices):
        PROVISIONAL = "provisional", _("Provisional")  # reported; the monitor has not compared it yet
        VERIFIED = "verified", _("Verified")  # the DHT record confirms the reported samples
        FLAGGED = "flagged", _("Flagged")  # the figures disagree: waits for an organizer's decision
        ACCEPTED = "accepted", _("Accepted")  # an organizer accepted a flagged epoch: counts as verified
        REJECTED = "rejected", _("Rejected")  # an organizer rejected it, or it can never be verified: no credit

    session = models.ForeignKey(TrainingSession, on_delete=models.CASCADE, related_name="epochs")
    epoch = models.PositiveIntegerField()
    reported_samples = models.PositiveBigIntegerField(default=0)
    announced_samples = models.PositiveBigIntegerField(null=True, blank=True)
    announced_final = models.BooleanField(default=True, help_text=(
        "Whether announced_samples is the peer's own count of the closed epoch (its metrics record), not a "
        "progress record read while the epoch was still gathering: only a final count can flag a report."))
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROVISIONAL)
    detail = models.CharField(max_length=500, blank=True, help_text="Why the monitor flagged it, with the figures.")
    checked_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    credited_samples = models.PositiveBigIntegerField(
        default=0, help_text="Confirmed samples the credit rollup has counted into the hourly buckets so far.")

    class Meta:
        ordering = ["session", "epoch"]
        constraints = [models.UniqueConstraint(fields=["session", "epoch"], name="one_row_per_session_epoch")]
        indexes = [models.Index(fields=["status"])]


# Details the verdicts store (runs/credit/verification.py) that the volunteer's page explains in plain words
# (runs/credit/volunteers.py, lost_reason).
NEVER_SEEN = "never seen in the DHT: no signed progress record of this session's peer for the epoch"
NEVER_CONFIRMED = "not confirmed within 6 h of its report: no signed record of this session's peer was judged for the epoch"
NO_STATE_HELD = "no state of epoch {epoch} was held to check it"


def epoch_confirmed_samples(*, status: str, reported: int, announced: int | None) -> int:
    """The samples of a session's epoch that earn credit: a verified epoch counts the smaller of the
    reported and the announced samples, an accepted one what was reported, any other nothing."""
    if status == SessionEpoch.Status.VERIFIED:
        return reported if announced is None else min(reported, announced)
    return reported if status == SessionEpoch.Status.ACCEPTED else 0


def epoch_rejected_samples(*, status: str, reported: int) -> int:
    """The samples of a session's epoch that earn nothing for good: all it reported, once rejected."""
    return reported if status == SessionEpoch.Status.REJECTED else 0


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


class CreditSums(models.Model):
    """Totals of a volunteer or a team: what the leaderboards read. Written only by the rollup
    (runs/credit/rollup.py), in batches, never per report."""

    samples = models.PositiveBigIntegerField(default=0, help_text="All samples reported.")
    samples_verified = models.PositiveBigIntegerField(default=0)
    samples_rejected = models.PositiveBigIntegerField(default=0)
    credit_provisional = models.FloatField(default=0)
    credit_verified = models.FloatField(default=0)
    credit = models.FloatField(default=0, help_text="Confirmed credit (the verified part): what boards rank by.")
    samples_24h = models.PositiveBigIntegerField(default=0)
    credit_24h = models.FloatField(default=0)
    samples_7d = models.PositiveBigIntegerField(default=0)
    credit_7d = models.FloatField(default=0)
    compute_seconds = models.FloatField(default=0, help_text="Time the volunteer's agents spent training.")
    recent_average_credit = models.FloatField(default=0, help_text="BOINC RAC: credit per day, half-life one week.")
    rac_updated_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class CreditFigures(CreditSums):
    """A volunteer's totals, with the machines they contributed from."""

    machines = models.PositiveIntegerField(default=0, help_text="Distinct agent tokens that reported.")

    class Meta:
        abstract = True


class RunCredit(CreditFigures):
    """A volunteer's totals in one run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="credits")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_credits")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user"], name="one_credit_per_run_user")]
        indexes = [
            models.Index(fields=["run", "-credit", "user"], name="run_credit_board_all"),
            models.Index(fields=["run", "-credit_24h", "user"], name="run_credit_board_24h"),
            models.Index(fields=["run", "-credit_7d", "user"], name="run_credit_board_7d"),
        ]


class VolunteerCredit(CreditFigures):
    """A volunteer's totals across all runs (credit is comparable across runs; samples are not)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit")

    class Meta:
        indexes = [
            models.Index(fields=["-credit", "user"], name="volunteer_credit_board_all"),
            models.Index(fields=["-credit_24h", "user"], name="volunteer_credit_board_24h"),
            models.Index(fields=["-credit_7d", "user"], name="volunteer_credit_board_7d"),
        ]


class RunCreditTotal(models.Model):
    """A run's totals over all its volunteers: the denominator of the boards' share column, one row
    read instead of a sum over the run's (up to 100,000) volunteer totals per request. Always the
    sum of the run's RunCredit rows: the rollup adds every change it makes to them here, in the
    same transaction. The all-runs board sums these rows (one per run)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="credit_total")
    samples = models.PositiveBigIntegerField(default=0, help_text="All samples reported.")
    samples_verified = models.PositiveBigIntegerField(default=0)
    samples_rejected = models.PositiveBigIntegerField(default=0)
    credit_provisional = models.FloatField(default=0)
    credit_verified = models.FloatField(default=0)
    credit = models.FloatField(default=0, help_text="Confirmed credit (the verified part): what boards rank by.")
    samples_24h = models.PositiveBigIntegerField(default=0)
    credit_24h = models.FloatField(default=0)
    samples_7d = models.PositiveBigIntegerField(default=0)
    credit_7d = models.FloatField(default=0)


class CreditHour(models.Model):
    """Samples and credit of one volunteer in one run that were confirmed during one hour (an
    epoch's verification, an organizer's acceptance): the 24 h and 7 d windows and the daily
    history of a profile are sums of these."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    samples = models.PositiveBigIntegerField(default=0)
    credit = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user", "hour"], name="one_credit_hour")]
        indexes = [models.Index(fields=["hour"]), models.Index(fields=["user", "hour"])]


class TeamFigures(CreditSums):
    """A team's totals, with what its board shows of its current members: those who contributed
    (in each window) and their machines. The rollup recounts them when members' totals change or
    members join or leave (TeamEvent)."""

    members = models.PositiveIntegerField(default=0)
    members_24h = models.PositiveIntegerField(default=0)
    members_7d = models.PositiveIntegerField(default=0)
    machines = models.PositiveIntegerField(default=0)
    machines_24h = models.PositiveIntegerField(default=0)
    machines_7d = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True


class RunTeamCredit(TeamFigures):
    """A team's totals in one run. Like BOINC's, a team keeps the credit its members earned while
    they were in it: the rollup adds each change of a volunteer's figures to the team they belong
    to when it applies the change, so a volunteer who changes teams takes nothing away from the old one.
    New samples count for the team the volunteer is in when the rollup takes them in; a later
    verification or rejection of earlier work moves credit within (or out of) the team the volunteer
    is in when it is applied, as BOINC grants credit to the team of the moment of validation."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="team_credits")
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="run_credits")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "team"], name="one_credit_per_run_team")]
        indexes = [
            models.Index(fields=["run", "-credit", "team"], name="run_team_credit_board_all"),
            models.Index(fields=["run", "-credit_24h", "team"], name="run_team_credit_board_24h"),
            models.Index(fields=["run", "-credit_7d", "team"], name="run_team_credit_board_7d"),
        ]


class TeamCredit(TeamFigures):
    """A team's totals across all runs: sums of its RunTeamCredit rows."""

    team = models.OneToOneField("accounts.Team", on_delete=models.CASCADE, related_name="credit")

    class Meta:
        indexes = [
            models.Index(fields=["-credit", "team"], name="team_credit_board_all"),
            models.Index(fields=["-credit_24h", "team"], name="team_credit_board_24h"),
            models.Index(fields=["-credit_7d", "team"], name="team_credit_board_7d"),
        ]


class TeamCreditHour(models.Model):
    """Samples and credit of a team's members in one run confirmed during one hour while in the team:
    the team's 24 h and 7 d windows are sums of these, as a volunteer's are of CreditHour."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    samples = models.PositiveBigIntegerField(default=0)
    credit = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "team", "hour"], name="one_team_credit_hour")]
        indexes = [models.Index(fields=["hour"], name="team_credit_hour_hour")]


class CreditRollup(models.Model):
    """The rollup's progress (one row): every contribution event with an id up to ``event_id``
    is in the aggregates. Moved in the same transaction as the aggregates, so a crash never
    counts an event twice nor loses one."""

    event_id = models.BigIntegerField(default=0)
    epochs_checked_at = models.DateTimeField(null=True, blank=True, help_text="SessionEpoch changes seen up to here.")
    windows_hour = models.DateTimeField(null=True, blank=True, help_text="Hour at which the 24 h / 7 d columns were last aged.")
    teams_checked_at = models.DateTimeField(null=True, blank=True, help_text="Team membership changes seen up to here.")
    pending_event_id = models.BigIntegerField(default=0, help_text="Events up to here were given their bounded time "
                                                                   "to be confirmed (runs.credit.verification.pending_expire).")
    updated_at = models.DateTimeField(null=True, blank=True)


class Milestone(models.Model):
    """A badge: a volunteer's or a team's confirmed samples or credit reached a threshold
    (runs/credit/milestones.py holds the thresholds), in one run or across all runs. Kept by the
    rollup from the totals, which count confirmed work only: when rejected work takes a total back
    below the threshold the badge is revoked (``revoked_at``), and given back if the total climbs
    again. One row per holder, scope, measure and threshold, so that awarding is idempotent."""

    class Measure(models.TextChoices):
        SAMPLES = "samples", _("samples")
        CREDIT = "credit", _("credit")

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="milestones")
    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="milestones")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="milestones",
                            help_text="The run it was reached in; none for all runs together.")
    measure = models.CharField(max_length=16, choices=Measure.choices)
    threshold = models.PositiveBigIntegerField()
    reached_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True,
                                      help_text="When rejected work took the total back below the threshold.")

    class Meta:
        ordering = ["run_id", "measure", "threshold"]
        constraints = [
            models.CheckConstraint(condition=models.Q(user__isnull=True) ^ models.Q(team__isnull=True),
                                   name="milestone_of_a_volunteer_or_a_team"),
            models.UniqueConstraint(fields=["user", "run", "measure", "threshold"], name="one_volunteer_run_milestone",
                                    condition=models.Q(user__isnull=False, run__isnull=False)),
            models.UniqueConstraint(fields=["user", "measure", "threshold"], name="one_volunteer_milestone",
                                    condition=models.Q(user__isnull=False, run__isnull=True)),
            models.UniqueConstraint(fields=["team", "run", "measure", "threshold"], name="one_team_run_milestone",
                                    condition=models.Q(team__isnull=False, run__isnull=False)),
            models.UniqueConstraint(fields=["team", "measure", "threshold"], name="one_team_milestone",
                                    condition=models.Q(team__isnull=False, run__isnull=True)),
        ]


def _certificate_code() -> str:
    return secrets.token_urlsafe(16)


class Certificate(models.Model):
    """A volunteer's contribution certificate for one run. It stores no figures: its page and its
    files recompute the name, confirmed credit and rank from the board each time, so a certificate
    can neither be inflated nor go stale. ``code`` is random (128 bits): the verification link
    cannot be guessed from a volunteer's or a run's name."""

    code = models.CharField(max_length=32, unique=True, default=_certificate_code, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="certificates")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="certificates")
    issued_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user"], name="one_certificate_per_run_user")]
