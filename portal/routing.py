"""Websocket routes. Browser routes keep the origin check; agent routes authenticate by token."""

websocket_urlpatterns: list = []
