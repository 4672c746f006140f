"""The runs app's periodic Celery tasks (CELERY_BEAT_SCHEDULE). A task that a service queues lives beside that
service (runs/setup/services.py)."""

import datetime

from celery import shared_task
from django.conf import settings

from runs.access import sessions
from runs.credit import exports, milestones, rollup, verification
from runs.evaluation import services as evaluation


@shared_task(ignore_result=True)
def credit_rollup_task() -> int:
    """Every ~10 s: contribution events into the leaderboards' aggregates (exactly once)."""
    return rollup.credit_rollup()


@shared_task(ignore_result=True)
def credit_rac_decay_task() -> int:
    """Hourly: recent average credit of idle volunteers decays."""
    return rollup.credit_rac_decay()


@shared_task(ignore_result=True)
def pending_expire_task() -> int:
    """Every few minutes: claims no one could confirm in their bounded time are rejected."""
    return verification.pending_expire()


@shared_task(ignore_result=True)
def sessions_close_silent_task() -> int:
    return sessions.sessions_close_silent(silent_for=datetime.timedelta(seconds=settings.SESSION_SILENT_CLOSE_SECONDS))


@shared_task(acks_late=True, ignore_result=True)
def stats_dump_task(day: str | None = None) -> str:
    """Daily: users, teams and per-run credit as gzip JSON and CSV under MEDIA_ROOT/stats/<day>/."""
    return str(exports.stats_dump(day=datetime.date.fromisoformat(day) if day else None))


@shared_task(ignore_result=True)
def milestones_refresh_task() -> int:
    """Hourly: every badge checked against the totals (the rollup keeps them; this is the safety net)."""
    return milestones.milestones_refresh_all()


@shared_task(ignore_result=True)
def evaluations_task() -> int:
    """Every ~30 s: evaluate checkpoints (and each run's random-init baseline) that have no evaluation."""
    return evaluation.evaluations_pending()
