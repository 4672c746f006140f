"""The Celery application: tasks live in each app's `tasks.py`, settings under `CELERY_`. Every
task run and failure is counted for Prometheus (portal/metrics.py), by task name."""

import logging
import logging.config
import os

from celery import Celery, signals

from portal.metrics import CELERY_TASK_FAILURES, CELERY_TASK_RUNS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _create_broker_folders(sender: Celery, **kwargs) -> None:
    # The file broker needs its folders before the first message is sent or read.
    options = sender.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            os.makedirs(options[key], exist_ok=True)


@signals.task_postrun.connect
def _count_task_run(sender=None, **kwargs) -> None:
    CELERY_TASK_RUNS.labels(task=sender.name).inc()


@signals.task_failure.connect
def _count_task_failure(sender=None, **kwargs) -> None:
    CELERY_TASK_FAILURES.labels(task=sender.name).inc()


@signals.setup_logging.connect
def _log_as_the_portal_does(loglevel: int | str | None = None, **kwargs) -> None:
    # Worker and beat write through settings.LOGGING (LOG_FORMAT=json included) instead of Celery's own
    # handlers; `--loglevel` still sets the level.
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)
