"""Websocket routes. Browser routes keep the origin check; agent routes authenticate by token
(agents send no Origin header, which AllowedHostsOriginValidator would refuse)."""

from django.urls import path

from runs.consumers import AgentConsumer

websocket_urlpatterns = [
    path("ws/agent/", AgentConsumer.as_asgi()),
]
