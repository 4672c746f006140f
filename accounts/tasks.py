"""Celery tasks of the accounts app: entry points that call one service each."""

import smtplib

from celery import shared_task

from accounts import notifications, password_reset, signup


@shared_task(acks_late=True, ignore_result=True, autoretry_for=(smtplib.SMTPException, OSError),
             retry_backoff=30, max_retries=6)
def notification_email_task(notification_id: int) -> str:
    """Send one notification's e-mail; a retry or a duplicate of this task sends nothing new."""
    return notifications.notification_email_send(notification_id=notification_id)


@shared_task(acks_late=True, ignore_result=True)
def password_reset_email_task(*, email: str, language: str, domain: str, use_https: bool) -> None:
    """Mail a password reset link to the accounts with `email`, if any (accounts.password_reset)."""
    password_reset.password_reset_send(email=email, language=language, domain=domain, use_https=use_https)


@shared_task(acks_late=True, ignore_result=True, autoretry_for=(smtplib.SMTPException, OSError),
             retry_backoff=30, max_retries=6)
def signup_email_task(*, pending_id: int) -> None:
    """Mail a sign-up's link, or a notice to the owner of its address if it has one (accounts.signup)."""
    signup.signup_email_send(pending_id=pending_id)


@shared_task(ignore_result=True)
def tokens_expiring_task() -> int:
    """Hourly: tell volunteers whose agent tokens expire within 7 days."""
    return notifications.tokens_expiring_notify()


@shared_task(ignore_result=True)
def notification_emails_pending_task() -> int:
    """Every 10 minutes: queue again e-mails a broker outage or a lost message left pending."""
    return notifications.notification_emails_pending()
