"""The embedded-defaults broker (portal/broker.py): a consumer never takes a message half-written."""

import os
import subprocess
import sys
from queue import Empty

import pytest
from django.conf import settings
from kombu import Connection

from accounts.notifications import notification_email_task
from accounts.password_reset import password_reset_email_task
from accounts.signup import signup_email_task
from portal import broker
from portal.celery import app
from runs.setup.services import run_event_notify_task, sources_check_task, tokenizer_train_task


@pytest.fixture
def connection(tmp_path):
    folder, control = str(tmp_path / "queue"), str(tmp_path / "control")
    os.makedirs(folder)
    options = {"data_folder_in": folder, "data_folder_out": folder, "control_folder": control}
    with Connection(transport=broker.Transport, transport_options=options) as c:
        yield c


def test_the_embedded_defaults_use_this_transport_and_redis_its_own():
    with app.connection_for_write() as c:
        expected = "redis" if settings.REDIS_URL else "portal.broker:Transport"
        assert c.transport_cls == expected


def test_a_message_goes_through_whole(connection):
    queue = connection.SimpleQueue("tasks")
    queue.put({"task": "credit_rollup", "args": [1, 2]})
    assert queue.get(timeout=5).payload == {"task": "credit_rollup", "args": [1, 2]}
    queue.close()


def test_a_message_is_not_in_the_queue_until_it_is_written_whole(connection, monkeypatch):
    channel = connection.default_channel
    rename = os.rename
    seen_while_writing = []

    def rename_and_look(source, target):
        # The moment before the message appears: complete on disk, and no consumer can take it yet.
        monkeypatch.setattr(os, "rename", rename)  # consumers rename files too
        seen_while_writing.append(os.path.getsize(source))
        with pytest.raises(Empty):
            channel._get("tasks")
        rename(source, target)

    monkeypatch.setattr(os, "rename", rename_and_look)
    payload = {"body": "x" * 100_000}
    channel._put("tasks", payload)
    assert seen_while_writing and seen_while_writing[0] > 100_000
    assert channel._get("tasks") == payload


def test_evaluations_have_a_queue_of_their_own_and_the_credit_rollup_keeps_the_default():
    """An evaluation runs for minutes; on the demo's one worker the board stood still meanwhile (CI23,
    docs/benchmarks.md section 22). The demo and docker-compose.yml give the queue a worker of its own."""
    route = app.amqp.router.route
    assert route({}, "runs.tasks.evaluations_task")["queue"].name == "evaluations"
    for task in ("runs.tasks.credit_rollup_task", "accounts.signup.signup_email_task"):
        assert route({}, task)["queue"].name == app.conf.task_default_queue == "celery"



def test_the_worker_registers_the_tasks_services_queue_and_the_periodic_ones():
    """A task a service queues lives beside it (CELERY_IMPORTS); a worker that did not import its module would
    drop the message as unregistered. What a fresh process imports as the worker starts is what it can run
    (here every module is imported already, so the check runs in a process of its own)."""
    worker = subprocess.run([sys.executable, "-c", WORKER_TASKS], capture_output=True, text=True, check=True,
                            env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}, timeout=120)
    queued = {notification_email_task, password_reset_email_task, signup_email_task, run_event_notify_task,
              sources_check_task, tokenizer_train_task}
    periodic = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {task.name for task in queued} | periodic <= set(worker.stdout.split())


WORKER_TASKS = """
import django
django.setup()
from portal.celery import app
from runs.setup.services import run_event_notify_task, sources_check_task, tokenizer_train_task
app.loader.import_default_modules()
print(*app.tasks)
"""
