"""ASGI entry point: Django views over HTTP, Channels consumers over websockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Load Django (apps, models) before importing anything that touches the ORM.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from portal.request_body import RequestBodyLimit  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402
from portal.snapshots import Snapshots  # noqa: E402
from portal.static_manifest import static_manifest_require  # noqa: E402

static_manifest_require()

application = ProtocolTypeRouter(
    {
        "http": Snapshots(RequestBodyLimit(django_asgi_app)),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
