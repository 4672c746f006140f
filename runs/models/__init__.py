"""The runs app's tables, one module per domain, as runs/ is laid out: a run and its setup (`setup`),
training sessions (`access`), what agents send (`ingest`), the credit ledger (`credit`), the swarm's
records (`swarm`) and evaluations (`evaluation`). Every table is importable from here."""

from runs.models.access import TrainingSession
from runs.models.credit import (
    NEVER_CONFIRMED,
    NEVER_SEEN,
    NO_STATE_HELD,
    Certificate,
    CreditFigures,
    CreditHour,
    CreditRollup,
    CreditSums,
    Milestone,
    RunCredit,
    RunCreditTotal,
    RunTeamCredit,
    SessionEpoch,
    TeamCredit,
    TeamCreditHour,
    TeamFigures,
    VolunteerCredit,
    epoch_confirmed_samples,
    epoch_rejected_samples,
)
from runs.models.evaluation import Evaluation, Probe, ProbeScore
from runs.models.ingest import ContributionEvent, ReportRejection, StepCommitment
from runs.models.setup import Backbone, DataFile, ModelLicense, Run, RunBan, RunEvent, RunMembership
from runs.models.swarm import Checkpoint, RunSample

__all__ = [
    "ModelLicense",
    "Run",
    "Backbone",
    "RunEvent",
    "RunMembership",
    "RunBan",
    "DataFile",
    "TrainingSession",
    "ContributionEvent",
    "StepCommitment",
    "ReportRejection",
    "SessionEpoch",
    "NEVER_SEEN",
    "NEVER_CONFIRMED",
    "NO_STATE_HELD",
    "epoch_confirmed_samples",
    "epoch_rejected_samples",
    "CreditSums",
    "CreditFigures",
    "RunCredit",
    "VolunteerCredit",
    "RunCreditTotal",
    "CreditHour",
    "TeamFigures",
    "RunTeamCredit",
    "TeamCredit",
    "TeamCreditHour",
    "CreditRollup",
    "Milestone",
    "Certificate",
    "RunSample",
    "Checkpoint",
    "Probe",
    "ProbeScore",
    "Evaluation",
]
