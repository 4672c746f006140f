"""Websocket routes. Browser routes keep the origin check; agent routes authenticate by token
(agents send no Origin header, which AllowedHostsOriginValidator would refuse)."""

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from accounts.live import NotificationsLiveConsumer
from runs.credit.live import BoardLiveConsumer, RunLiveConsumer
from runs.ingest.consumers import AgentConsumer


def for_browsers(consumer):
    return AllowedHostsOriginValidator(AuthMiddlewareStack(consumer))


websocket_urlpatterns = [
    path("ws/agent/", AgentConsumer.as_asgi()),
    path("ws/runs/<slug:slug>/live/", for_browsers(RunLiveConsumer.as_asgi())),
    path("ws/leaderboard/live/", for_browsers(BoardLiveConsumer.as_asgi())),
    path("ws/notifications/live/", for_browsers(NotificationsLiveConsumer.as_asgi())),
]
