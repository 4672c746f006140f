"""E-mail verification: a signed, expiring link mailed at sign-up and at every change of address.

The link signs the user's id *and* the address (Django's `signing`, with its own salt), so a link
mailed to an old address stops working once the volunteer changes it, and no other link of the
portal (password reset, unsubscribe) can stand in for it.
"""

import datetime

from django.conf import settings
from django.core import signing
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.emails import email_send
from accounts.models import User

_SALT = "accounts.verification"


class VerificationFailed(Exception):
    """A link that verifies nothing; the message says why and what to do, for the person who opened it."""


def verification_required(user: User) -> bool:
    """Whether `user` must still verify their address before creating agent tokens."""
    return settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED and not user.email_verified


def verification_link(*, user: User) -> str:
    token = signing.dumps({"u": user.pk, "e": user.email.lower()}, salt=_SALT, compress=True)
    return settings.SITE_URL + reverse("email-verify", args=[token])


def verification_send(*, user: User) -> None:
    """Mail `user` a link that verifies their current address, in their language."""
    days = settings.EMAIL_VERIFICATION_DAYS
    email_send(user=user, template="accounts/email/verify", context={"link": verification_link(user=user), "days": days},
               subject=lambda: _("Confirm your e-mail address for DeDLOC Portal"))


def verification_check(*, token: str) -> User:
    """Verify the address `token` was mailed to and return its user, or raise VerificationFailed."""
    max_age = datetime.timedelta(days=settings.EMAIL_VERIFICATION_DAYS)
    try:
        claim = signing.loads(token, salt=_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise VerificationFailed(_("This link has expired. Log in and ask for a new one on your agent tokens page.")) from None
    except signing.BadSignature:
        raise VerificationFailed(_("This link is not valid: it may be cut short or altered. "
                                   "Copy the whole link from the e-mail, or ask for a new one.")) from None
    user = User.objects.filter(pk=claim.get("u")).first() if isinstance(claim, dict) else None
    if user is None or user.email.lower() != claim.get("e"):
        raise VerificationFailed(_("This link was sent to an address that is no longer on the account. "
                                   "Use the link in the latest e-mail we sent."))
    if user.email_verified_at is None:
        User.objects.filter(pk=user.pk, email_verified_at=None).update(email_verified_at=timezone.now())
        user.refresh_from_db(fields=["email_verified_at"])
    return user


def email_change(*, user: User) -> None:
    """A new address is unverified until its own link is opened."""
    User.objects.filter(pk=user.pk).update(email_verified_at=None)
    user.email_verified_at = None
    verification_send(user=user)
