"""The accounts app's periodic Celery tasks (CELERY_BEAT_SCHEDULE). A task that a service queues lives
beside that service (accounts/notifications.py, accounts/signup.py, accounts/password_reset.py)."""

from celery import shared_task

from accounts import notifications


@shared_task(ignore_result=True)
def tokens_expiring_task() -> int:
    """Hourly: tell volunteers whose agent tokens expire within 7 days."""
    return notifications.tokens_expiring_notify()


@shared_task(ignore_result=True)
def notification_emails_pending_task() -> int:
    """Every 10 minutes: queue again e-mails a broker outage or a lost message left pending."""
    return notifications.notification_emails_pending()
