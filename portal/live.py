"""Live feeds for browsers: a websocket that pushes a snapshot, then each one that differs, polled at
an interval from a per-process cache (runs/credit/live.py: the boards; accounts/live.py: the bell).
A feed is for whoever may watch it now, not only when it connected: each asks again every few
seconds, before it sends, and closes once its viewer may no longer watch."""

import asyncio
import json
import logging
import time
from collections.abc import Callable, Hashable
from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import DatabaseError

from portal.metrics import VIEWER_SOCKETS_OPEN

logger = logging.getLogger(__name__)

# How soon a ban, a list change or a sign-out reaches an open feed: the agent socket's re-check interval
# for its reports (SESSION_RECHECK_SECONDS in runs/ingest/consumers.py).
VIEWER_RECHECK_SECONDS = 5.0

# One computation per key per interval in this process, however many people watch.
_cached: dict[Hashable, tuple[float, Any]] = {}
_locks: dict[Hashable, asyncio.Lock] = {}


async def cached(key: Hashable, compute: Callable[[], Any], max_age: float) -> Any:
    """``compute()`` (it may read the database), computed at most once per ``max_age`` for ``key``
    in this process."""
    lock = _locks.setdefault(key, asyncio.Lock())
    async with lock:
        entry = _cached.get(key)
        if entry and time.monotonic() - entry[0] < max_age:
            return entry[1]
        value = await database_sync_to_async(compute, thread_sensitive=False)()
        _cached[key] = (time.monotonic(), value)
        return value


async def cached_snapshot(key: Hashable, compute: Callable[[], dict], interval: float) -> str:
    """``compute()`` as JSON text, computed at most once per ``interval`` for ``key`` in this process."""
    return await cached(key, lambda: json.dumps(compute()), interval)


async def current_viewer(scope: dict):
    """The user the socket's session names now, read afresh as the next page would read it:
    anonymous once they signed out, their account was deactivated or their password changed.
    Channels' AuthMiddleware read ``scope["user"]`` once, when the socket connected."""
    session_key = getattr(scope.get("session"), "session_key", None)
    if not session_key:
        return AnonymousUser()
    return await get_user({"session": import_module(settings.SESSION_ENGINE).SessionStore(session_key)})


class PushingConsumer(AsyncWebsocketConsumer):
    """A viewer's feed: the current snapshot, then each one that differs, polled every ``interval``.
    Each viewer polls the cached snapshot and never hears from a group, so it needs no channel
    layer: with Redis, one blocking read per viewer timed out at 500 viewers.

    Before it sends, a feed asks ``may_watch`` again once the last answer is ``recheck`` seconds
    old, and closes with ``refusal_code`` (what ``connect`` answers such a viewer) when it is no."""

    channel_layer_alias = None
    feed = "snapshot"
    interval = 0.5
    recheck = VIEWER_RECHECK_SECONDS
    refusal_code = 4403

    async def snapshot(self) -> str:
        raise NotImplementedError

    async def may_watch(self) -> bool:
        """Whether the viewer may still watch this feed (asked every ``recheck`` seconds)."""
        return True

    async def start(self) -> None:
        await self.accept()
        VIEWER_SOCKETS_OPEN.inc()
        self.pusher = asyncio.create_task(self._push())

    async def _push(self) -> None:
        sent, checked = None, time.monotonic()
        while True:
            try:
                text = await self.snapshot()
            except DatabaseError:
                # A transient failure (a locked SQLite table, a restarted database) must not end
                # the viewer's feed for good: the next interval tries again.
                logger.warning("live %s failed; retrying", self.feed, exc_info=True)
                text = sent
            # Asked after the snapshot is read: a snapshot holding what was written after a ban
            # was read after the ban, so the answer already knows of it.
            if time.monotonic() - checked >= self.recheck:
                allowed = await self._asked()
                if allowed is False:
                    await self.close(code=self.refusal_code)
                    return
                if allowed is None:  # unasked, nothing is sent; the next interval asks again
                    text = sent
                else:
                    checked = time.monotonic()
            if text != sent:
                await self.send(text)
                sent = text
            await asyncio.sleep(self.interval)

    async def _asked(self) -> bool | None:
        """``may_watch()``, or None while the database cannot answer (as for a snapshot, a transient
        failure must not end the feed for good)."""
        try:
            return await self.may_watch()
        except DatabaseError:
            logger.warning("live %s: could not ask who may watch; retrying", self.feed, exc_info=True)
            return None

    async def disconnect(self, code: int) -> None:
        if getattr(self, "pusher", None):  # accepted, and counted
            self.pusher.cancel()
            VIEWER_SOCKETS_OPEN.dec()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Viewers only listen."""
