"""Django's admin site, with the site's log-in limit on its log-in page."""

from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse

from accounts.forms import AdminLoginForm
from portal.ratelimit import rate_limited_page

admin.site.login_form = AdminLoginForm


@login_not_required
def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin's own log-in view; a refusal by the limit is sent as a 429 with `Retry-After`,
    as the site's log-in page sends it (the admin's view has no hook for the status)."""
    response = admin.site.login(request)
    form = (getattr(response, "context_data", None) or {}).get("form")
    limited = getattr(form, "rate_limited", None)
    return rate_limited_page(response, limited) if limited else response
