"""Password reset, asked for on a page and mailed by a Celery task.

The page does the same work for every address: it counts the asker and the address, queues a task
and answers the same page. Only the task looks the address up, off the request path, so neither
the answer nor its time tells whether an account has that address.
"""

import logging

from celery import shared_task
from django.contrib.auth.forms import PasswordResetForm
from django.utils import translation

from portal.ratelimit import RateLimited, rate_limit_hit

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True)
def password_reset_email_task(*, email: str, language: str, domain: str, use_https: bool) -> None:
    """Mail a password reset link to the accounts with `email`, if any."""
    password_reset_send(email=email, language=language, domain=domain, use_https=use_https)


def password_reset_request(*, email: str, ip: str | None, language: str, domain: str, use_https: bool) -> None:
    """Queue the reset mail for `email`; raise RateLimited when the asker's address asked too often.

    An address that was sent too many links gets no more for a while, silently: saying so would
    tell the asker about someone else's mailbox.
    """
    rate_limit_hit(name="reset_client", key=str(ip))
    try:
        rate_limit_hit(name="reset_email", key=email.lower())
    except RateLimited:
        logger.info("password reset not mailed: the address was sent too many links recently")
        return
    try:
        password_reset_email_task.delay(email=email, language=language, domain=domain, use_https=use_https)
    except Exception:  # a broker outage: the asker sees the same page and may ask again
        logger.warning("could not queue a password reset mail", exc_info=True)


def password_reset_send(*, email: str, language: str, domain: str, use_https: bool) -> None:
    """Mail a reset link to every active account with `email`, in `language`; nothing when there is none."""
    form = PasswordResetForm({"email": email})
    if not form.is_valid():
        return
    with translation.override(language):
        form.save(domain_override=domain, use_https=use_https)
