"""The bell is live: `WS /ws/notifications/live/` pushes the signed-in volunteer's own unread count,
and a new count as soon as the worker makes a notice, with no reload."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client

from accounts import live
from accounts.models import Notification
from accounts.notifications import notify
from portal.asgi import application
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the consumer reads the database from other threads


def _headers(user) -> list:
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [(b"origin", b"http://127.0.0.1"), (b"cookie", cookie.encode())]


def _notify(user, key: str) -> None:
    with transaction.atomic():
        notify(user=user, kind=Notification.Kind.MILESTONE, key=key, context={"milestone": "1,000 samples", "url": "/"})


def test_each_volunteer_hears_their_own_count_and_a_new_notice_without_a_reload(monkeypatch):
    monkeypatch.setattr(live.NotificationsLiveConsumer, "interval", 0.05)
    rahim, sima = UserFactory(username="rahim"), UserFactory(username="sima")
    _notify(rahim, "first")
    rahim_headers, sima_headers = _headers(rahim), _headers(sima)

    async def scenario() -> tuple[list[int], list[int]]:
        rahims = WebsocketCommunicator(application, "/ws/notifications/live/", headers=rahim_headers)
        simas = WebsocketCommunicator(application, "/ws/notifications/live/", headers=sima_headers)
        assert (await rahims.connect(timeout=10))[0] and (await simas.connect(timeout=10))[0]
        try:
            heard_rahim = [json.loads(await rahims.receive_from(timeout=10))["unread"]]
            heard_sima = [json.loads(await simas.receive_from(timeout=10))["unread"]]
            await database_sync_to_async(_notify)(rahim, "second")
            heard_rahim.append(json.loads(await rahims.receive_from(timeout=10))["unread"])
            assert await simas.receive_nothing(timeout=0.3), "sima's count did not change, so nothing is pushed"
            return heard_rahim, heard_sima
        finally:
            await rahims.disconnect()
            await simas.disconnect()

    heard_rahim, heard_sima = async_to_sync(scenario)()
    assert heard_rahim == [1, 2]
    assert heard_sima == [0]
