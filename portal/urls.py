from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.static import serve

from portal import views
from portal.api import api

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # Any other path under the API answers in the API's JSON error shape, not an HTML page.
    re_path(r"^api/", views.api_not_found),
    path("", include("accounts.urls")),
    path("", include("runs.urls")),
]

if settings.DEBUG:
    urlpatterns += [re_path(r"^media/(?P<path>.*)$", serve, {"document_root": settings.MEDIA_ROOT})]
