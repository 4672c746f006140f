"""The credit ledger: each session's epoch judged (runs/credit/verification.py), the aggregates the rollup
keeps for the boards (runs/credit/rollup.py), milestones and certificates."""

import secrets

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from portal.snapshots import version_publish
from runs.models.access import TrainingSession
from runs.models.setup import Run


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
    boards_version = models.BigIntegerField(default=0, help_text=(
        "A new value whenever anything a leaderboard or the run list shows may have changed: the boards' cache "
        "(runs/credit/boards.py) and the API's snapshots (portal/snapshots.py) are keyed by it."))

    @classmethod
    def boards_changed(cls) -> None:
        """Anything a leaderboard shows may have changed (totals, badges, a public name or visibility): every
        cached board is read anew. In the caller's transaction, so readers see the new version with the change.
        A random value, not a count: a count starts again at 1 in another database (a restored backup, a test's)
        that shares the cache, and would find that database's boards there."""
        version = secrets.randbits(62) + 1
        if not cls.objects.filter(pk=1).update(boards_version=version):
            cls.objects.get_or_create(pk=1, defaults={"boards_version": version})
        # After the commit, so that a web process reading the rows under this version finds them.
        transaction.on_commit(lambda: version_publish(version))


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
