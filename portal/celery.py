"""The Celery application: tasks live in each app's `tasks.py`, settings under `CELERY_`. Every
task run and failure is counted for Prometheus (portal/metrics.py), by task name."""

import os

from celery import Celery
from celery.signals import task_failure, task_postrun

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


@task_postrun.connect
def _count_task_run(sender=None, **kwargs) -> None:
    CELERY_TASK_RUNS.labels(task=sender.name).inc()


@task_failure.connect
def _count_task_failure(sender=None, **kwargs) -> None:
    CELERY_TASK_FAILURES.labels(task=sender.name).inc()
