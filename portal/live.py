"""Live feeds for browsers: a websocket that pushes a snapshot, then each one that differs: read by one
poller per snapshot in the process that hands each new one to all its viewers (runs/credit/live.py:
the boards), or polled by each viewer (accounts/live.py: the bell). A feed is for whoever may watch
it now, not only when it connected: each asks again every few seconds, before it sends, and closes
once its viewer may no longer watch."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Hashable
from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.consumer import get_handler_name
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


class SharedSnapshot:
    """A snapshot many viewers in this process watch (a run's board): ``compute()`` as JSON text, read by
    one task every ``interval`` while anyone watches, and each text that differs handed to all of them at
    once. Viewers polling a cache each were 20,000 wake-ups a second at 10,000 viewers, most finding
    nothing new, and a new snapshot reached the last of them seconds after the first."""

    def __init__(self, key: Hashable, compute: Callable[[], dict], interval: float) -> None:
        self.key, self.compute, self.interval = key, compute, interval
        self.loop = asyncio.get_running_loop()
        self.text: str | None = None
        self.watchers = 0
        self.read = asyncio.Event()  # set once the first read is done (or failed)
        self.news = asyncio.Event()  # set, and replaced, when the text changes
        self.poller = asyncio.create_task(self._poll())

    @classmethod
    def join(cls, key: Hashable, compute: Callable[[], dict], interval: float) -> "SharedSnapshot":
        """The snapshot of ``key`` in this process, with one more watcher (``leave`` when done)."""
        shared = _shared.get(key)
        if shared is None or shared.loop is not asyncio.get_running_loop():  # none, or one of a loop now gone (tests)
            shared = _shared[key] = cls(key, compute, interval)
        shared.watchers += 1
        return shared

    def leave(self) -> None:
        self.watchers -= 1

    async def current(self) -> str | None:
        await self.read.wait()
        return self.text

    async def changed(self, seen: str | None, timeout: float) -> None:
        """Return once the text is not ``seen``, or after ``timeout`` seconds."""
        if self.text != seen:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.news.wait()

    async def _poll(self) -> None:
        try:
            while self.watchers or not self.read.is_set():
                try:
                    text = await database_sync_to_async(lambda: json.dumps(self.compute()), thread_sensitive=False)()
                except DatabaseError:
                    # A transient failure (a locked SQLite table, a restarted database) must not end
                    # the feed for good: the next interval tries again.
                    logger.warning("live snapshot %s failed; retrying", self.key, exc_info=True)
                else:
                    if text != self.text:
                        self.text = text
                        self.news.set()
                        self.news = asyncio.Event()
                self.read.set()
                await asyncio.sleep(self.interval)
        finally:
            # Before the task ends, in the same step as the last check: a viewer joining later starts anew.
            if _shared.get(self.key) is self:
                del _shared[self.key]


_shared: dict[Hashable, SharedSnapshot] = {}


async def current_viewer(scope: dict):
    """The user the socket's session names now, read afresh as the next page would read it:
    anonymous once they signed out, their account was deactivated or their password changed.
    Channels' AuthMiddleware read ``scope["user"]`` once, when the socket connected."""
    session_key = getattr(scope.get("session"), "session_key", None)
    if not session_key:
        return AnonymousUser()
    return await get_user({"session": import_module(settings.SESSION_ENGINE).SessionStore(session_key)})


class PushingConsumer(AsyncWebsocketConsumer):
    """A viewer's feed: the current snapshot, then each one that differs: its ``shared`` snapshot's
    (set in ``connect``) as soon as it changes, or else ``snapshot()`` polled every ``interval``.
    Viewers never hear from a group, so they need no channel layer: with Redis, one blocking read
    per viewer timed out at 500 viewers.

    Before it sends, a feed asks ``may_watch`` again once the last answer is ``recheck`` seconds
    old, and closes with ``refusal_code`` (what ``connect`` answers such a viewer) when it is no."""

    channel_layer_alias = None
    feed = "snapshot"
    interval = 0.5
    recheck = VIEWER_RECHECK_SECONDS
    refusal_code = 4403
    shared: SharedSnapshot | None = None

    async def dispatch(self, message: dict) -> None:
        # As the agent socket's (runs/ingest/consumers.py): without Channels' hop to its one sync thread before
        # every message, behind every other socket's. Opening 10,000 viewers took 508 s with it. Each database
        # call here runs through database_sync_to_async, which closes stale connections itself.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def snapshot(self) -> str | None:
        return await self.shared.current()

    async def changed(self, seen: str | None, timeout: float) -> None:
        """Return once there may be a snapshot other than ``seen``, at the latest after ``timeout``."""
        if self.shared is None:
            await asyncio.sleep(self.interval)
        else:
            await self.shared.changed(seen, timeout)

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
                text = seen = await self.snapshot()
            except DatabaseError:
                # A transient failure (a locked SQLite table, a restarted database) must not end
                # the viewer's feed for good: the next interval tries again.
                logger.warning("live %s failed; retrying", self.feed, exc_info=True)
                text = seen = sent
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
            # Until a snapshot other than the one just read, or the next answer is due (an interval at least).
            await self.changed(seen, max(self.interval, checked + self.recheck - time.monotonic()))

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
        if self.shared is not None:
            self.shared.leave()
            self.shared = None

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Viewers only listen."""
