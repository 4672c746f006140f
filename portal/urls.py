from django.contrib import admin
from django.urls import include, path, re_path
from django.views.i18n import JavaScriptCatalog

from accounts import views as account_views
from portal import views
from portal.admin import admin_login
from portal.api import api

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/login/", admin_login),  # ahead of the admin's own: the same page, rate limited
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # Any other path under the API answers in the API's JSON error shape, not an HTML page.
    re_path(r"^api/", views.api_not_found),
    # The switcher's form posts here: Django's set_language, which also keeps the choice for e-mails.
    path("i18n/setlang/", account_views.language_set, name="set_language"),
    path("jsi18n/", JavaScriptCatalog.as_view(), name="javascript-catalog"),
    path("", include("accounts.urls")),
    path("", include("runs.urls")),
]
# MEDIA_ROOT is never served as such: it holds invite-only runs' data and tokenizers, which
# agents fetch through the API's checked, signed links.
