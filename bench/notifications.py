"""What exactly-once notifications cost: a run's lifecycle event told to N volunteers, and their e-mails.

Creates N volunteers who trained for one run, then times, each against a baseline in the same run:

- **fan-out**: ``runs.setup.services.run_event_notify`` (one row per volunteer, each in a savepoint
  so that the unique (user, kind, key) can refuse a repeat) against one ``bulk_create`` of the same
  rows, what a notifier with no idempotency would write;
- **replay**: the same event notified again (a retried task): every row refused, nothing new;
- **e-mails**: ``accounts.notifications.notification_email_send`` for each row (claim under lock,
  hourly count, render text and HTML, send through Django's in-memory backend) against rendering and
  sending the same messages with no claim.

E-mails are queued by the fan-out only after its commit; the bench keeps them out of the fan-out's
time and sends them in the third step. ERASES the database's volunteers and runs first: point
DATABASE_URL at a scratch database.

    DATABASE_URL=postgres://postgres@127.0.0.1:55471/notify .venv/bin/python -m bench.notifications --volunteers 2000
"""

import argparse
import os
import time


def _setup_django() -> None:
    if not os.environ.get("DATABASE_URL"):
        raise SystemExit("set DATABASE_URL to a scratch database: the benchmark erases it")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ["EMAIL_BACKEND"] = "django.core.mail.backends.locmem.EmailBackend"
    import django

    django.setup()


def _world(volunteers: int):
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone

    from accounts.models import AgentToken, Notification, User
    from runs.access.authority import authority_generate
    from runs.models import Run, RunEvent, TrainingSession
    from runs.setup.forms import preset_config

    call_command("migrate", verbosity=0)
    Notification.objects.all().delete()
    Run.objects.all().delete()
    User.objects.all().delete()
    public_key, private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
    run = Run.objects.create(name="Bench", slug="bench", status=Run.Status.PAUSED, config=preset_config("tiny").model_dump(
        mode="json"), authority_public_key=public_key, authority_private_key=private_key)
    now = timezone.now()
    users = User.objects.bulk_create([User(username=f"v{i}", email=f"v{i}@bench.invalid", email_verified_at=now,
                                           pseudonym=f"volunteer-bench{i}") for i in range(volunteers)])
    tokens = AgentToken.objects.bulk_create([AgentToken(user=user, name="bench", prefix="dlp_", digest=f"{user.pk:064d}",
                                                        expires_at=now + timezone.timedelta(days=30)) for user in users])
    TrainingSession.objects.bulk_create([
        TrainingSession(run=run, user=token.user, token=token, peer_public_key=f"key{token.pk}", agent_version="0.1.0",
                        access_expires_at=now) for token in tokens])
    event = RunEvent.objects.create(run=run, kind=RunEvent.Kind.PAUSED)
    return run, event, users


def _timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--volunteers", type=int, default=2000, help="volunteers who trained for the run")
    args = parser.parse_args()
    _setup_django()
    from django.core import mail
    from django.db import transaction
    from django.test.utils import setup_test_environment

    from accounts import notifications
    from accounts.models import Notification
    from runs.setup.services import run_event_notify

    setup_test_environment()  # the in-memory outbox
    run, event, users = _world(args.volunteers)
    n = args.volunteers
    queued = []
    real_queue, notifications._email_queue = notifications._email_queue, queued.append

    fanout, made = _timed(lambda: run_event_notify(event_id=event.pk))
    replay, again = _timed(lambda: run_event_notify(event_id=event.pk))
    ids = list(Notification.objects.order_by("pk").values_list("pk", flat=True))

    def baseline_rows():
        with transaction.atomic():
            Notification.objects.bulk_create([Notification(user=user, kind="run_paused", key=f"baseline:{event.pk}",
                                                            context={"run": run.name, "url": run.get_absolute_url()})
                                              for user in users])
            transaction.set_rollback(True)

    bulk, _ = _timed(baseline_rows)
    notifications._email_queue = real_queue

    # One e-mail per volunteer: the hourly throttle holds none back, so both sides send them all.
    emails, states = _timed(lambda: [notifications.notification_email_send(notification_id=pk) for pk in ids])
    sent = len(mail.outbox)
    rows = list(Notification.objects.select_related("user").filter(pk__in=ids))
    plain, _ = _timed(lambda: [notifications._notification_email(row, row.user).send() for row in rows])

    print(f"volunteers: {n}; notifications made {made}, on replay {again}; e-mails sent {sent} "
          f"({states.count('sent')} sent states), queued after commit {len(queued)}")
    print("| step | portal | baseline | ratio |")
    print("|---|---|---|---|")
    print(f"| fan-out, {n} rows | {fanout:.2f} s ({n / fanout:,.0f}/s) | bulk_create {bulk:.2f} s ({n / bulk:,.0f}/s) "
          f"| {fanout / bulk:.1f}× |")
    print(f"| replay of the event | {replay:.2f} s ({n / replay:,.0f}/s), 0 new | — | {replay / fanout:.2f}× the fan-out |")
    print(f"| e-mails, {n} | {emails:.2f} s ({n / emails:,.0f}/s) | render and send, no claim {plain:.2f} s "
          f"({n / plain:,.0f}/s) | {emails / plain:.2f}× |")


if __name__ == "__main__":
    main()
