"""Notifications: one row per event for the bell, and an e-mail sent by a Celery task.

Other parts of the portal report an event with :func:`notify`; the row is written in the caller's
transaction (it appears exactly when the event commits) and the e-mail is queued once that
transaction commits (:func:`notification_email_task`). The e-mail is sent at most once:
the task claims the row (pending → sending) under a lock before it sends, so a retried or
duplicated task finds nothing to claim; volunteers who opted out of the kind, or whose address
is unverified, or who got `NOTIFICATION_EMAILS_PER_HOUR` e-mails in the last hour, get the bell only.
"""

import datetime
import logging
import smtplib

from celery import shared_task
from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

from accounts.emails import email_build
from accounts.models import AgentToken, Notification, User

logger = logging.getLogger(__name__)

Kind = Notification.Kind
TOKEN_NOTICE = datetime.timedelta(days=7)
PENDING_SWEEP_AFTER = datetime.timedelta(minutes=5)
_UNSUBSCRIBE_SALT = "accounts.notifications.unsubscribe"


def notify(*, user: User, kind: str, key: str, context: dict | None = None) -> Notification | None:
    """Tell `user` about an event: a notification for the bell and, unless held back, an e-mail.

    `kind` is a `Notification.Kind` value; `key` names the event so that reporting it again does
    nothing (e.g. ``f"badge:{badge.pk}"``); `context` holds what the message shows, as JSON:
    ``url`` (a path on this site, the notification's link), ``run`` (a run's name), and per kind:
    ``token`` and ``expires`` (ISO time) for TOKEN_EXPIRING; ``epoch`` for CREDIT_FLAGGED and
    CREDIT_DECIDED, with ``accepted`` (bool) for the latter; ``session`` for SESSION_SUSPENDED;
    ``milestone`` (the milestone's name, in words) for MILESTONE. Returns the new notification, or
    None when this event was already reported. Call it inside the transaction that records the event.
    For one event told to many volunteers at once, :func:`notify_many` writes the rows in one insert.
    """
    context = _checked(kind, context)
    try:
        with transaction.atomic():
            notification = Notification.objects.create(user=user, kind=kind, key=key[:200], context=context)
    except IntegrityError:
        return None  # reported before: the unique (user, kind, key) keeps one row and one e-mail
    transaction.on_commit(lambda: _email_queue(notification.pk))
    return notification


def notify_many(*, user_ids: list[int], kind: str, key: str, context: dict | None = None) -> int:
    """:func:`notify` for many volunteers at once, about one event (a run paused): one insert that
    skips those told already. Returns the notifications made. Two copies of a task racing here may
    both queue an e-mail for a row; the e-mail task's claim sends it once."""
    context = _checked(kind, context)
    told = set(Notification.objects.filter(kind=kind, key=key, user_id__in=user_ids).values_list("user_id", flat=True))
    fresh = [user_id for user_id in user_ids if user_id not in told]
    Notification.objects.bulk_create([Notification(user_id=user_id, kind=kind, key=key[:200], context=context)
                                      for user_id in fresh], ignore_conflicts=True)
    made = list(Notification.objects.filter(kind=kind, key=key, user_id__in=fresh, email_state=Notification.Email.PENDING)
                .values_list("pk", flat=True))
    transaction.on_commit(lambda: [_email_queue(pk) for pk in made])
    return len(made)


def _checked(kind: str, context: dict | None) -> dict:
    if kind not in Kind.values:
        raise ValueError(f"unknown notification kind {kind!r}")
    context = dict(context or {})
    url = str(context.get("url", "/"))
    if not (url.startswith("/") and url_has_allowed_host_and_scheme(url, allowed_hosts=set())):
        raise ValueError("a notification's url must be a path on this site")
    return context


@shared_task(acks_late=True, ignore_result=True, autoretry_for=(smtplib.SMTPException, OSError),
             retry_backoff=30, max_retries=6)
def notification_email_task(notification_id: int) -> str:
    """Send one notification's e-mail; a retry or a duplicate of this task sends nothing new."""
    return notification_email_send(notification_id=notification_id)


def _email_queue(notification_id: int) -> None:
    try:
        notification_email_task.delay(notification_id)
    except Exception:  # a broker outage must not fail the event that was just committed
        logger.warning("could not queue the e-mail of notification %s; the pending sweep will", notification_id,
                       exc_info=True)


def notification_emails_pending(*, now: datetime.datetime | None = None) -> int:
    """Queue again the e-mails still pending a while after their notification (the broker was down,
    a message was lost); the claim keeps any that was queued twice to one e-mail. Notifications
    older than two days are left unsent: news that late is noise. Returns how many were queued."""
    now = now or timezone.now()
    stale = Notification.objects.filter(email_state=Notification.Email.PENDING, created_at__lt=now - PENDING_SWEEP_AFTER,
                                        created_at__gte=now - datetime.timedelta(days=2))
    ids = list(stale.order_by("pk").values_list("pk", flat=True)[:1000])
    for notification_id in ids:
        _email_queue(notification_id)
    return len(ids)


def notification_text(notification: Notification) -> str:
    """What the notification says, in the active language."""
    c = notification.context
    names = {"run": c.get("run", ""), "token": c.get("token", ""), "epoch": c.get("epoch", ""),
             "session": c.get("session", ""), "milestone": c.get("milestone", "")}
    if notification.kind == Kind.TOKEN_EXPIRING:
        expires = parse_datetime(c.get("expires", "")) if c.get("expires") else None
        names["date"] = formats.date_format(timezone.localtime(expires), "DATETIME_FORMAT") if expires else "?"
        return _("Your agent token “%(token)s” expires on %(date)s. Create a new one before then, or its machine "
                 "stops contributing.") % names
    if notification.kind == Kind.RUN_PAUSED:
        return _("Run “%(run)s”, which you train for, was paused by its organizers. Your agent waits and "
                 "continues when the run resumes.") % names
    if notification.kind == Kind.RUN_RESUMED:
        return _("Run “%(run)s” was resumed: your agents can train for it again.") % names
    if notification.kind == Kind.RUN_FINISHED:
        return _("Run “%(run)s” is finished. Thank you for training it!") % names
    if notification.kind == Kind.CREDIT_FLAGGED:
        return _("Your credit for epoch %(epoch)s of run “%(run)s” was flagged: its figures do not match what "
                 "the swarm saw. An organizer will review it; until then it is not confirmed.") % names
    if notification.kind == Kind.CREDIT_DECIDED and c.get("accepted"):
        return _("An organizer accepted your flagged credit for epoch %(epoch)s of run “%(run)s”: "
                 "it counts now.") % names
    if notification.kind == Kind.CREDIT_DECIDED:
        return _("An organizer rejected your flagged credit for epoch %(epoch)s of run “%(run)s”: "
                 "it earns nothing.") % names
    if notification.kind == Kind.SESSION_SUSPENDED:
        return _("Spot checks suspended your training session %(session)s in run “%(run)s”: its work did not "
                 "recompute as reported. Its credit waits for an organizer's review.") % names
    if c.get("measure") and c.get("threshold"):
        # Badges (runs/credit/milestones.py) send their figures, so that each reader gets them in their language.
        names["milestone"] = milestone_words(measure=c["measure"], threshold=int(c["threshold"]), run_name=c.get("run"))
    return _("You reached a milestone: %(milestone)s.") % names


def milestone_words(*, measure: str, threshold: int, run_name: str | None) -> str:
    """A milestone badge (runs/credit/milestones.py) in words, in the active language:
    "1,000 confirmed samples in run “Bangla ALBERT”"."""
    amount = formats.number_format(threshold, force_grouping=True)
    words = (_("%(amount)s confirmed samples") if measure == "samples"
             else _("%(amount)s GFLOP of confirmed credit")) % {"amount": amount}
    if run_name:
        return _("%(milestone)s in run “%(run)s”") % {"milestone": words, "run": run_name}
    return _("%(milestone)s across all runs") % {"milestone": words}


def notification_url(notification: Notification) -> str:
    """Where the notification leads, as a path on this site."""
    if notification.context.get("url"):
        return notification.context["url"]
    return reverse("tokens") if notification.kind == Kind.TOKEN_EXPIRING else reverse("notifications")


def notifications_mark_read(*, user: User, ids: list[int] | None = None) -> int:
    """Mark `user`'s notifications read (all unread ones when `ids` is None); others' are never touched."""
    unread = Notification.objects.filter(user=user, read_at=None)
    if ids is not None:
        unread = unread.filter(pk__in=ids)
    return unread.update(read_at=timezone.now())


# --- e-mail ---------------------------------------------------------------------------------------

def unsubscribe_link(*, user: User, kind: str) -> str:
    token = signing.dumps({"u": user.pk, "k": kind}, salt=_UNSUBSCRIBE_SALT, compress=True)
    return settings.SITE_URL + reverse("unsubscribe", args=[token])


def unsubscribe_claim(*, token: str) -> tuple[User, str] | None:
    """The volunteer and kind a signed unsubscribe link names, or None for a forged or broken one.
    The links never expire: an old e-mail's link must still work."""
    try:
        claim = signing.loads(token, salt=_UNSUBSCRIBE_SALT)
    except signing.BadSignature:
        return None
    user = User.objects.filter(pk=claim.get("u")).first() if isinstance(claim, dict) else None
    if user is None or claim.get("k") not in Kind.values:
        return None
    return user, claim["k"]


def email_opt_out(*, user: User, kind: str) -> None:
    if kind not in user.email_opt_outs:
        user.email_opt_outs = sorted({*user.email_opt_outs, kind})
        user.save(update_fields=["email_opt_outs"])


def _email_held_back(notification: Notification, user: User, now: datetime.datetime) -> str | None:
    """Why this notification is not e-mailed, as its final state, or None to send it."""
    if not user.is_active or notification.kind in user.email_opt_outs:
        return Notification.Email.OPTED_OUT
    if settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED and not user.email_verified:
        return Notification.Email.UNVERIFIED
    sent = Notification.objects.filter(user=user, emailed_at__gte=now - datetime.timedelta(hours=1),
                                       email_state__in=[Notification.Email.SENDING, Notification.Email.SENT])
    if sent.count() >= settings.NOTIFICATION_EMAILS_PER_HOUR:
        return Notification.Email.THROTTLED
    return None


def notification_email_send(*, notification_id: int) -> str:
    """Send the notification's e-mail if it is still pending; returns its e-mail state.

    The claim commits before the message goes out: a worker that dies after sending leaves the row
    "sending", and the retry sends nothing (at most once). A send that raises puts it back to pending
    for the task's retry.
    """
    now = timezone.now()
    with transaction.atomic():
        notification = Notification.objects.select_for_update().filter(pk=notification_id).first()
        if notification is None or notification.email_state != Notification.Email.PENDING:
            return notification.email_state if notification else "missing"
        # One volunteer's e-mails are claimed one at a time, so that the hourly count holds.
        user = User.objects.select_for_update().get(pk=notification.user_id)
        state = _email_held_back(notification, user, now) or Notification.Email.SENDING
        notification.email_state = state
        notification.emailed_at = now if state == Notification.Email.SENDING else None
        notification.save(update_fields=["email_state", "emailed_at"])
    if state != Notification.Email.SENDING:
        return state
    try:
        _notification_email(notification, user).send()
    except Exception:
        Notification.objects.filter(pk=notification.pk, email_state=Notification.Email.SENDING).update(
            email_state=Notification.Email.PENDING, emailed_at=None)
        raise
    Notification.objects.filter(pk=notification.pk).update(email_state=Notification.Email.SENT)
    return Notification.Email.SENT


def _notification_email(notification: Notification, user: User):
    unsubscribe = unsubscribe_link(user=user, kind=notification.kind)
    context = {"notification": notification, "unsubscribe_link": unsubscribe,
               "link": settings.SITE_URL + notification_url(notification),
               "settings_link": settings.SITE_URL + reverse("profile"),
               # A callable: the template calls it inside email_build's switch to the volunteer's language.
               "text": lambda: notification_text(notification)}
    return email_build(user=user, template="accounts/email/notification", context=context,
                       subject=lambda: _("DeDLOC Portal: %(kind)s") % {"kind": notification.get_kind_display()},
                       headers={"List-Unsubscribe": f"<{unsubscribe}>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"})


# --- events the accounts app sees itself ---------------------------------------------------------

def tokens_expiring_notify(*, now: datetime.datetime | None = None) -> int:
    """Notify the owners of live tokens that expire within 7 days (once per token). Tokens made to
    last 7 days or less are left out: their owners chose the short life. Returns the notifications made."""
    now = now or timezone.now()
    soon = AgentToken.objects.filter(revoked_at=None, expires_at__gt=now, expires_at__lte=now + TOKEN_NOTICE,
                                     user__is_active=True).select_related("user")
    made = 0
    for token in soon.iterator():
        if token.expires_at - token.created_at <= TOKEN_NOTICE:
            continue
        with transaction.atomic():
            made += notify(user=token.user, kind=Kind.TOKEN_EXPIRING, key=f"token:{token.pk}",
                           context={"token": token.name, "expires": token.expires_at.isoformat(),
                                    "url": reverse("tokens")}) is not None
    return made
