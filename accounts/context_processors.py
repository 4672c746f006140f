from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from accounts.selectors import notification_unread_count


def notifications(request: HttpRequest) -> dict:
    """The bell's unread count, counted only on pages that show it (a logged-in volunteer's)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"unread_notifications": SimpleLazyObject(lambda: notification_unread_count(user=user))}
