"""The Celery application: periodic tasks live in each app's `tasks.py`, tasks that a service queues beside
that service (`CELERY_IMPORTS`), settings under `CELERY_`. Every
task run and failure is counted for Prometheus (portal/metrics.py), by task name, and every line a
task logs (Celery's own included) carries the task's id as its request id (portal/logs.py)."""

import logging
import logging.config
import os

from celery import Celery, signals
from django.conf import settings

from portal.logs import log_context
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


# The context each running task's lines are logged in, by task id: entered before the task and left
# after Celery logged its outcome.
_task_log_contexts: dict[str, object] = {}


@signals.task_prerun.connect
def _log_context_enter(task_id: str | None = None, **kwargs) -> None:
    context = log_context(request_id=task_id)
    context.__enter__()
    _task_log_contexts[task_id] = context


@signals.task_postrun.connect
def _count_task_run(sender=None, task_id: str | None = None, **kwargs) -> None:
    CELERY_TASK_RUNS.labels(task=sender.name).inc()
    context = _task_log_contexts.pop(task_id, None)
    if context is not None:
        context.__exit__(None, None, None)


@signals.task_failure.connect
def _count_task_failure(sender=None, **kwargs) -> None:
    CELERY_TASK_FAILURES.labels(task=sender.name).inc()


@signals.setup_logging.connect
def _log_as_the_portal_does(loglevel: int | str | None = None, **kwargs) -> None:
    # Worker and beat write through settings.LOGGING (LOG_FORMAT=json included) instead of Celery's own
    # handlers; `--loglevel` still sets the level.
    logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)
