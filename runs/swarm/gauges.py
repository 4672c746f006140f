"""Each active run's figures for Prometheus, read from the database when ``/metrics`` is scraped.

The coordinator, the Celery worker and the web processes each write part of them; read at scrape
time they are right whichever process wrote them, and a run that ends simply stops being listed.
A few queries per active run, once per scrape.
"""

import datetime
import math
from collections.abc import Iterator

from django.db.models import Func, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from runs.credit.rollup import rollup_lag_seconds
from runs.models import Run, RunCreditTotal, SessionEpoch, StepCommitment, TrainingSession
from runs.swarm.series import series_latest

RUN_GAUGES = {
    "dedloc_run_alive_peers": "Peers alive in the run's swarm at the monitor's latest reading (0 before any reading).",
    "dedloc_run_samples_per_second": "The swarm's training throughput at the monitor's latest reading.",
    "dedloc_run_global_epoch": "The swarm's global epoch at the monitor's latest reading.",
    "dedloc_run_loss": "The swarm's mean loss at the monitor's latest reading.",
    "dedloc_run_coordinator_heartbeat_age_seconds": "Seconds since the run's coordinator last beat (+Inf if it never did).",
    "dedloc_run_pending_credit": "Credit reported but not confirmed yet (pending and flagged).",
    "dedloc_run_flagged_epochs": "Session epochs flagged by the monitor, waiting for an organizer's decision.",
    "dedloc_run_spot_checks_pending": "Committed epochs the validator has not checked yet (it falls behind as this grows).",
    "dedloc_run_spot_checks_queued": "Spot checks queued for validator workers and not recorded yet (SPOT_CHECK_WORKERS).",
    "dedloc_run_spot_check_queue_age_seconds": "How long the oldest of those has waited (0 with none queued).",
    "dedloc_run_spot_checks_failed": "Spot checks in the run whose recomputed work did not match the commitment.",
    "dedloc_run_suspended_sessions": "Sessions suspended by failed spot checks, waiting for an organizer.",
}
ROLLUP_LAG = ("dedloc_credit_rollup_lag_seconds", "How long the oldest contribution event not rolled up yet has waited.")


class RunGauges:
    """A prometheus_client collector, registered on the registry each scrape of ``/metrics`` reads."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = timezone.now()
        families = {name: GaugeMetricFamily(name, help_text, labels=["run"]) for name, help_text in RUN_GAUGES.items()}
        outcome = StepCommitment.Outcome
        # Subqueries, not joins: several counts over different children of a run would multiply each other.
        runs = (Run.objects.filter(status=Run.Status.ACTIVE)
                .annotate(flagged=_count(SessionEpoch, status=SessionEpoch.Status.FLAGGED),
                          checks_pending=_count(StepCommitment, outcome=outcome.PENDING),
                          checks_queued=_count(StepCommitment, outcome=outcome.PENDING, queued_at__isnull=False),
                          queued_since=Subquery(StepCommitment.objects.filter(
                              session__run=OuterRef("pk"), outcome=outcome.PENDING, queued_at__isnull=False)
                              .order_by("queued_at").values("queued_at")[:1]),
                          checks_failed=_count(StepCommitment, outcome=outcome.FAILED),
                          suspended=_count(TrainingSession, suspended_at__isnull=False))
                .order_by("slug"))
        pending = dict(RunCreditTotal.objects.filter(run__status=Run.Status.ACTIVE).values_list("run_id", "credit_provisional"))
        for run in runs:
            for name, value in run_figures(run=run, now=now, pending_credit=pending.get(run.pk, 0.0)).items():
                families[name].add_metric([run.slug], value)
        yield from families.values()
        yield GaugeMetricFamily(*ROLLUP_LAG, value=rollup_lag_seconds(now=now))


def _count(model, **conditions) -> Coalesce:
    """The number of the run's ``model`` rows (sessions, or a session's children) that meet ``conditions``."""
    run_field = "run" if model is TrainingSession else "session__run"
    rows = model.objects.filter(**{run_field: OuterRef("pk")}, **conditions).order_by().values(run_field)
    return Coalesce(Subquery(rows.annotate(n=Func("pk", function="COUNT")).values("n")), 0)


def run_figures(*, run: Run, now: datetime.datetime, pending_credit: float) -> dict[str, float]:
    """The run's gauges by name; a figure the monitor has not read yet is left out, not made up."""
    heartbeat = run.coordinator_heartbeat_at
    figures = {
        "dedloc_run_coordinator_heartbeat_age_seconds": (now - heartbeat).total_seconds() if heartbeat else math.inf,
        "dedloc_run_pending_credit": pending_credit,
        "dedloc_run_flagged_epochs": run.flagged,
        "dedloc_run_spot_checks_pending": run.checks_pending,
        "dedloc_run_spot_checks_queued": run.checks_queued,
        "dedloc_run_spot_check_queue_age_seconds": (now - run.queued_since).total_seconds() if run.queued_since else 0.0,
        "dedloc_run_spot_checks_failed": run.checks_failed,
        "dedloc_run_suspended_sessions": run.suspended,
        "dedloc_run_alive_peers": 0,
    }
    latest = series_latest(run=run)
    if latest is not None:
        figures.update({
            "dedloc_run_alive_peers": latest.alive_peers,
            "dedloc_run_samples_per_second": latest.samples_per_second,
            "dedloc_run_global_epoch": latest.global_epoch,
        })
        if latest.loss is not None:
            figures["dedloc_run_loss"] = latest.loss
    return figures
