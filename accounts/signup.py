"""Sign-up that never tells whether an address has an account (ACCOUNT_EMAIL_VERIFICATION_REQUIRED).

The page validates the form, keeps the sign-up as a PendingSignUp with its password already hashed,
queues a task and answers the same page for every address. Only the task looks the address up, off
the request path: a free address is mailed the link that creates the account; the owner of a taken
one is mailed a notice instead, and nothing is created. The link creates the account, its address
confirmed by the opening, and works once.
"""

import datetime
import logging
import secrets
import smtplib

from celery import shared_task
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.emails import email_send
from accounts.forms import PERSON_SKELETONS
from accounts.models import PendingSignUp, User
from accounts.names import name_clean
from accounts.services import token_digest
from portal.ratelimit import RateLimited, rate_limit_hit

logger = logging.getLogger(__name__)


class SignUpFailed(Exception):
    """A link that creates no account; the message says why and what to do, for the person who opened it."""


@shared_task(acks_late=True, ignore_result=True, autoretry_for=(smtplib.SMTPException, OSError),
             retry_backoff=30, max_retries=6)
def signup_email_task(*, pending_id: int) -> None:
    """Mail a sign-up's link, or a notice to the owner of its address if it has one."""
    signup_email_send(pending_id=pending_id)


def signup_request(*, username: str, email: str, password: str, language: str) -> None:
    """Keep the sign-up and queue its mail: the same queries and the same hashing for every address."""
    # Expired sign-ups are forgotten here, which needs no periodic task; it is one query, for any address.
    expired = timezone.now() - datetime.timedelta(days=settings.EMAIL_VERIFICATION_DAYS)
    PendingSignUp.objects.filter(created_at__lt=expired).delete()
    pending = PendingSignUp.objects.create(username=username, email=email, password=make_password(password),
                                           language=language)
    try:
        # Per address mailed, silently past it (as password reset mails): every sign-up with an address that
        # has an account mails its owner a notice, and the page must not tell whether one was sent.
        rate_limit_hit(name="signup_email", key=email.lower())
    except RateLimited:
        logger.info("sign-up not mailed: the address was sent too many sign-up mails recently")
        return
    try:
        signup_email_task.delay(pending_id=pending.pk)
    except Exception:  # a broker outage: the person sees the same page and may sign up again
        logger.warning("could not queue a sign-up mail", exc_info=True)


def signup_email_send(*, pending_id: int) -> None:
    """Mail the link that creates the account, or, when the address has an account already, a notice
    to its owner; then that sign-up is forgotten. A second run mails a new link, and only the latest works."""
    pending = PendingSignUp.objects.filter(pk=pending_id).first()
    if pending is None:
        return
    owner = User.objects.filter(email__iexact=pending.email).first()
    if owner is not None:
        context = {"login_link": settings.SITE_URL + reverse("login"),
                   "reset_link": settings.SITE_URL + reverse("password_reset")}
        email_send(user=owner, template="accounts/email/signup_taken", context=context,
                   subject=lambda: _("Someone tried to sign up with your e-mail address on DeDLOC Portal"))
        pending.delete()  # after the mail, so that a retry of a failed send still finds it
        return
    newcomer = User(username=pending.username, email=pending.email, language=pending.language)
    context = {"link": signup_link_issue(pending=pending), "days": settings.EMAIL_VERIFICATION_DAYS}
    email_send(user=newcomer, template="accounts/email/signup_confirm", context=context,
               subject=lambda: _("Confirm your e-mail address for DeDLOC Portal"))


def signup_link_issue(*, pending: PendingSignUp) -> str:
    """A new link for `pending`, the only one that works from now on; only its digest is kept."""
    secret = secrets.token_urlsafe(32)
    PendingSignUp.objects.filter(pk=pending.pk).update(token_digest=token_digest(secret))
    return settings.SITE_URL + reverse("signup-confirm", args=[secret])


def signup_pending(*, secret: str) -> PendingSignUp:
    """The sign-up the link with `secret` was mailed for, if it can still become an account; or SignUpFailed."""
    pending = PendingSignUp.objects.filter(token_digest=token_digest(secret)).first()
    if pending is None:
        raise _link_unknown()
    if pending.expires_at <= timezone.now():
        raise SignUpFailed(_("This link has expired; your account was not created. Sign up again to get a new link."))
    if User.objects.filter(email__iexact=pending.email).exists():
        raise SignUpFailed(_("An account with this e-mail address was created after you signed up, so no new one "
                             "was. Log in to it, or reset its password if you forgot it."))
    try:
        pending.username = name_clean(pending.username, rivals=User.objects.all(), skeleton_fields=PERSON_SKELETONS)
    except ValidationError:
        raise SignUpFailed(_("Someone took the username “%(name)s” after you signed up, so your account was not "
                             "created. Sign up again with another username.") % {"name": pending.username}) from None
    return pending


def signup_confirm(*, secret: str) -> User:
    """Create the account the link with `secret` was mailed for, its address confirmed; or SignUpFailed."""
    pending = signup_pending(secret=secret)
    user = User(username=pending.username, email=pending.email, password=pending.password, language=pending.language,
                email_verified_at=timezone.now())
    try:
        with transaction.atomic():
            # Deleting claims the link: of two clicks at once, one deletes the row and the other finds none.
            if PendingSignUp.objects.filter(pk=pending.pk).delete()[0] == 0:
                raise _link_unknown()
            user.save()
    except IntegrityError:  # the name or the address was taken between the checks and this insert
        raise SignUpFailed(_("Someone took this username or e-mail address a moment ago, so your account was not "
                             "created. Sign up again.")) from None
    return user


def _link_unknown() -> SignUpFailed:
    return SignUpFailed(_("This link was used already, or it is not valid. If you opened it before, your account "
                          "exists: log in. Otherwise copy the whole link from the e-mail, or sign up again."))
