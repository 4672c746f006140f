"""Notifications: each event makes one notification and at most one e-mail, however often its task
runs; e-mails respect opt-outs, unsubscribe links and the hourly throttle, and speak the volunteer's
language; nobody reads or marks another's notifications."""

import datetime
import smtplib

import pytest
from celery.exceptions import Retry
from django.core import mail
from django.core.mail import EmailMultiAlternatives
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import notifications
from accounts.models import Notification
from accounts.notifications import notification_email_task, notify
from accounts.services import token_create
from accounts.tasks import notification_emails_pending_task, tokens_expiring_task
from runs.credit import verification
from runs.models import RunEvent, SessionEpoch
from runs.setup.services import run_event_notify_task, run_transition
from tests.factories import RunFactory
from tests.runs.epochs import judge, report, session_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """`with committed():` runs what waits for the commit (the e-mail tasks) at the block's end."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def trained(organizer, volunteer):
    """An active run of olga's that vik trains for, with one session."""
    run = RunFactory(name="Bangla ALBERT", slug="bangla", organizers=[organizer])
    return run, session_for(run, user=volunteer)


def _pause(run, organizer, again):
    run_transition(run=run, actor=organizer, action="pause")
    again(lambda: run_event_notify_task.delay(RunEvent.objects.filter(run=run, kind="paused").get().pk))


def _event_token_expiring(run, session, organizer, again):
    token, _ = token_create(user=session.user, name="home desktop", lifetime=datetime.timedelta(days=30))
    # Made 25 days ago for 30 days: 5 left.
    token.__class__.objects.filter(pk=token.pk).update(created_at=timezone.now() - datetime.timedelta(days=25),
                                                       expires_at=timezone.now() + datetime.timedelta(days=5))
    tokens_expiring_task.delay()
    again(tokens_expiring_task.delay)


def _event_run_resumed(run, session, organizer, again):
    _pause(run, organizer, again)
    run_transition(run=run, actor=organizer, action="resume")
    again(lambda: run_event_notify_task.delay(RunEvent.objects.filter(run=run, kind="resumed").get().pk))


def _event_run_finished(run, session, organizer, again):
    run_transition(run=run, actor=organizer, action="finish")
    again(lambda: run_event_notify_task.delay(RunEvent.objects.filter(run=run, kind="finished").get().pk))


def _flag(run, session, again):
    report(session, 64, epoch=3)
    verification.announced_record(session_id=session.pk, epoch=3, announced=32)
    judge(run, 3)
    again(lambda: judge(run, 3))


def _event_credit_flagged(run, session, organizer, again):
    _flag(run, session, again)


def _event_credit_decided(run, session, organizer, again):
    _flag(run, session, again)
    flag = SessionEpoch.objects.get(session=session, epoch=3)
    verification.flag_accept(row=flag, by=organizer)
    again(lambda: verification.flag_reject(row=flag, by=organizer))  # decided already: refused, tells nobody


def _event_session_suspended(run, session, organizer, again):
    report(session, 64, epoch=3)
    verification.session_suspend(session=session, reason="2 spot checks failed")
    again(lambda: verification.session_suspend(session=session, reason="2 spot checks failed"))


def _event_milestone(run, session, organizer, again):
    notify(user=session.user, kind="milestone", key="badge:7", context={"milestone": "100,000 samples in Bangla ALBERT"})
    again(lambda: notify(user=session.user, kind="milestone", key="badge:7", context={"milestone": "again"}))


EVENTS = {
    "token_expiring": (_event_token_expiring, "home desktop"),
    "run_paused": (lambda run, session, organizer, again: _pause(run, organizer, again), "was paused"),
    "run_resumed": (_event_run_resumed, "was resumed"),
    "run_finished": (_event_run_finished, "is finished"),
    "credit_flagged": (_event_credit_flagged, "epoch 3"),
    "credit_decided": (_event_credit_decided, "accepted"),
    "session_suspended": (_event_session_suspended, "Spot checks suspended"),
    "milestone": (_event_milestone, "100,000 samples"),
}


def test_every_kind_has_an_event_test():
    assert set(EVENTS) == set(Notification.Kind.values)


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_each_event_makes_one_notification_and_one_email_however_often_it_is_reported(kind, trained, organizer, committed):
    run, session = trained
    trigger, words = EVENTS[kind]

    def again(action):
        try:
            action()
        except verification.CreditError:
            pass  # an organizer's second decision is refused; what matters is that it tells nobody

    with committed():
        trigger(run, session, organizer, again)
    notifications = Notification.objects.filter(user=session.user, kind=kind)
    assert notifications.count() == 1
    assert notifications.get().email_state == Notification.Email.SENT
    mails = [m for m in mail.outbox if words in m.body]
    assert len(mails) == 1 and mails[0].to == [session.user.email]
    sent = Notification.objects.filter(email_state=Notification.Email.SENT).count()
    assert len(mail.outbox) == sent, "no e-mail without its notification, none twice"
    assert not Notification.objects.exclude(user=session.user).exists(), "the organizer hears nothing of it"


def test_a_suspension_tells_once_rather_than_once_per_flagged_epoch(trained, committed):
    run, session = trained
    for epoch in (1, 2, 3):
        report(session, 64, epoch=epoch)
        judge(run, epoch)
    with committed():
        verification.session_suspend(session=session, reason="2 spot checks failed")
    assert SessionEpoch.objects.filter(session=session, status="flagged").count() == 3
    assert list(Notification.objects.values_list("kind", flat=True)) == ["session_suspended"]


def test_a_short_lived_token_the_volunteer_chose_brings_no_warning(volunteer):
    token_create(user=volunteer, name="one-day test", lifetime=datetime.timedelta(days=1))
    assert tokens_expiring_task.delay().get() == 0


def _milestone(user, key="badge:1"):
    return notify(user=user, kind="milestone", key=key, context={"milestone": f"milestone {key}"})


def test_a_task_run_twice_sends_one_email(volunteer, committed):
    with committed():
        notification = _milestone(volunteer)
    assert len(mail.outbox) == 1
    assert notification_email_task.delay(notification.pk).get() == "sent"
    notification_email_task.apply(args=[notification.pk])
    assert len(mail.outbox) == 1


def test_a_retry_after_the_worker_died_mid_send_sends_nothing_more(volunteer):
    """The worker claimed the row and may have sent the e-mail before it died: at most once."""
    notification = _milestone(volunteer)  # its task waits for a commit that never comes here
    Notification.objects.filter(pk=notification.pk).update(email_state="sending", emailed_at=timezone.now())
    assert notification_email_task.delay(notification.pk).get() == "sending"
    assert mail.outbox == []


def test_a_send_that_fails_is_retried_and_lands_once(volunteer, monkeypatch):
    notification = _milestone(volunteer)
    real_send, calls = EmailMultiAlternatives.send, []

    def flaky_send(message, *args, **kwargs):
        calls.append(message.subject)
        if len(calls) == 1:
            raise smtplib.SMTPServerDisconnected("the mail server hung up")
        return real_send(message, *args, **kwargs)

    monkeypatch.setattr(EmailMultiAlternatives, "send", flaky_send)
    with pytest.raises(Retry):  # the worker would run it again after a backoff; here the test does
        notification_email_task.delay(notification.pk)
    notification.refresh_from_db()
    assert notification.email_state == "pending" and mail.outbox == []
    notification_email_task.delay(notification.pk)
    assert len(calls) == 2 and len(mail.outbox) == 1
    notification.refresh_from_db()
    assert notification.email_state == "sent"


def test_past_the_hourly_limit_the_bell_still_rings_but_no_email_goes(volunteer, committed, settings, client_for):
    settings.NOTIFICATION_EMAILS_PER_HOUR = 2
    with committed():
        for key in ("badge:1", "badge:2", "badge:3"):
            _milestone(volunteer, key)
    assert len(mail.outbox) == 2
    assert Notification.objects.get(key="badge:3").email_state == "throttled"
    page = client_for(volunteer).get(reverse("notifications")).content.decode()
    assert all(f"milestone badge:{n}" in page for n in (1, 2, 3))
    assert 'class="bell-count" aria-hidden="true">3<' in page
    Notification.objects.filter(email_state="sent").update(emailed_at=timezone.now() - datetime.timedelta(minutes=61))
    with committed():
        _milestone(volunteer, "badge:4")
    assert len(mail.outbox) == 3, "an hour later e-mails go again"


def test_an_opted_out_kind_is_shown_but_not_emailed(volunteer, committed, client_for):
    client = client_for(volunteer)
    kept = [kind for kind in Notification.Kind.values if kind != "milestone"]
    client.post(reverse("profile"), {"display_name": "", "email": volunteer.email, "visibility": "public",
                                     "language": "en", "emails": kept})
    volunteer.refresh_from_db()
    assert volunteer.email_opt_outs == ["milestone"]
    assert 'value="milestone"' in client.get(reverse("profile")).content.decode()
    with committed():
        _milestone(volunteer)
        notify(user=volunteer, kind="run_paused", key="run-event:1", context={"run": "Bangla ALBERT"})
    assert [m.subject for m in mail.outbox] == ["DeDLOC Portal: A run I train for is paused"]
    assert Notification.objects.get(kind="milestone").email_state == "opted_out"
    assert "milestone badge:1" in client.get(reverse("notifications")).content.decode()


def test_the_unsubscribe_link_works_logged_out_and_a_get_alone_changes_nothing(volunteer, committed):
    with committed():
        notify(user=volunteer, kind="run_paused", key="run-event:1", context={"run": "Bangla ALBERT"})
    message = mail.outbox[0]
    assert message.extra_headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = message.extra_headers["List-Unsubscribe"].strip("<>")
    assert link in message.body and link in message.alternatives[0][0]
    path = link.split("://", 1)[1].split("/", 1)[1]

    anonymous = Client()
    assert anonymous.get(f"/{path}").status_code == 200
    volunteer.refresh_from_db()
    assert volunteer.email_opt_outs == [], "a mail scanner opening the link unsubscribes nobody"
    done = anonymous.post(f"/{path}")
    assert done.status_code == 200 and "no more e-mails" in done.content.decode()
    volunteer.refresh_from_db()
    assert volunteer.email_opt_outs == ["run_paused"]
    with committed():
        notify(user=volunteer, kind="run_paused", key="run-event:2", context={"run": "Bangla ALBERT"})
        _milestone(volunteer)
    assert len(mail.outbox) == 2 and "milestone" in mail.outbox[1].body, "only the one kind stopped"


def test_a_forged_unsubscribe_link_is_refused(volunteer):
    response = Client().post(reverse("unsubscribe", args=["eyJ1IjoxLCJrIjoibWlsZXN0b25lIn0:forged:signature"]))
    assert response.status_code == 400 and "not valid" in response.content.decode()


def test_an_outsider_can_neither_read_nor_mark_anothers_notifications(volunteer, outsider, client_for):
    secret = _milestone(volunteer, "badge:secret")
    own = _milestone(outsider, "badge:own")
    oscar = client_for(outsider)
    assert "badge:secret" not in oscar.get(reverse("notifications")).content.decode()
    assert oscar.post(reverse("notifications-read"), {"id": [secret.pk, own.pk]}).status_code == 302
    secret.refresh_from_db()
    own.refresh_from_db()
    assert secret.read_at is None and own.read_at is not None
    oscar.post(reverse("notifications-read"), {"all": "1"})
    secret.refresh_from_db()
    assert secret.read_at is None
    assert 'class="bell-count"' in client_for(volunteer).get("/").content.decode()


@pytest.mark.parametrize("ids", [[], ["abc"], ["1e9"], ["9" * 40], ["²"], ["-1"]])
def test_marking_read_without_valid_ids_is_refused_with_a_reason(volunteer, client_for, ids):
    response = client_for(volunteer).post(reverse("notifications-read"), {"id": ids})
    assert response.status_code == 400 and b"notifications" in response.content


def test_marking_read_empties_the_bell(volunteer, client_for):
    _milestone(volunteer)
    client = client_for(volunteer)
    assert 'class="bell-count"' in client.get("/").content.decode()
    client.post(reverse("notifications-read"), {"all": "1"})
    assert 'class="bell-count"' not in client.get("/").content.decode()


def test_emails_are_plain_text_and_html_in_the_volunteers_language(volunteer, committed):
    volunteer.language = "bn"
    volunteer.save()
    with committed():
        notify(user=volunteer, kind="run_finished", key="run-event:9", context={"run": "Bangla ALBERT", "url": "/runs/bangla/"})
    message = mail.outbox[0]
    assert "Bangla ALBERT" in message.body and "শেষ" in message.body and "finished" not in message.body
    html, kind = message.alternatives[0]
    assert kind == "text/html" and 'lang="bn"' in html and "/runs/bangla/" in html


@pytest.mark.parametrize(("kind", "context"), [("no_such_kind", {}), ("milestone", {"url": "https://evil.example/"}),
                                               ("milestone", {"url": "//evil.example/"}),
                                               ("milestone", {"url": "/\\evil.example/"})])
def test_notify_refuses_an_unknown_kind_or_a_link_off_the_site(volunteer, kind, context):
    with pytest.raises(ValueError):
        notify(user=volunteer, kind=kind, key="k", context=context)


def test_the_language_switcher_sets_the_language_of_a_volunteers_emails(volunteer, client_for, committed):
    response = client_for(volunteer).post("/i18n/setlang/", {"language": "bn", "next": "/runs/"})
    assert response.status_code == 302 and response.cookies["django_language"].value == "bn"
    volunteer.refresh_from_db()
    assert volunteer.language == "bn"
    with committed():
        notify(user=volunteer, kind="run_resumed", key="run-event:5", context={"run": "Bangla ALBERT"})
    assert "আবার চালু" in mail.outbox[0].body
    client_for(volunteer).post("/i18n/setlang/", {"language": "xx"})
    volunteer.refresh_from_db()
    assert volunteer.language == "bn", "a language the portal does not speak is ignored"


def test_a_broker_outage_neither_fails_the_event_nor_loses_the_email(trained, organizer, committed, monkeypatch):
    from kombu.exceptions import OperationalError

    run, session = trained

    def broker_down(*args, **kwargs):
        raise OperationalError("Error 111 connecting to redis:6379. Connection refused.")

    with monkeypatch.context() as patched:
        patched.setattr(notification_email_task, "delay", broker_down)
        with committed():
            run_transition(run=run, actor=organizer, action="pause")
    run.refresh_from_db()
    assert run.status == "paused" and mail.outbox == []
    assert Notification.objects.get(user=session.user).email_state == "pending"

    assert notification_emails_pending_task.delay().get() == 0, "a fresh notification waits for its own task"
    later = timezone.now() + datetime.timedelta(minutes=6)
    assert notifications.notification_emails_pending(now=later) == 1
    assert notifications.notification_emails_pending(now=later) == 0
    assert len(mail.outbox) == 1 and "was paused" in mail.outbox[0].body


def test_the_beat_runs_the_expiry_scan_and_the_pending_sweep(settings):
    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {tokens_expiring_task.name, notification_emails_pending_task.name} <= tasks
