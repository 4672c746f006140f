"""Live feeds for browsers: a websocket that pushes a snapshot, then each one that differs, polled at
an interval from a per-process cache (runs/credit/live.py: the boards; accounts/live.py: the bell)."""

import asyncio
import json
import logging
import time
from collections.abc import Callable, Hashable

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from portal.metrics import VIEWER_SOCKETS_OPEN

logger = logging.getLogger(__name__)

# One snapshot per feed per interval in this process, however many people watch it.
_snapshots: dict[Hashable, tuple[float, str]] = {}
_locks: dict[Hashable, asyncio.Lock] = {}


async def cached_snapshot(key: Hashable, compute: Callable[[], dict], interval: float) -> str:
    """``compute()`` as JSON text, computed at most once per ``interval`` for ``key`` in this process."""
    lock = _locks.setdefault(key, asyncio.Lock())
    async with lock:
        cached = _snapshots.get(key)
        if cached and time.monotonic() - cached[0] < interval:
            return cached[1]
        snapshot = await database_sync_to_async(compute, thread_sensitive=False)()
        text = json.dumps(snapshot)
        _snapshots[key] = (time.monotonic(), text)
        return text


class PushingConsumer(AsyncWebsocketConsumer):
    """A viewer's feed: the current snapshot, then each one that differs, polled every ``interval``.
    Each viewer polls the cached snapshot and never hears from a group, so it needs no channel
    layer: with Redis, one blocking read per viewer timed out at 500 viewers."""

    channel_layer_alias = None
    feed = "snapshot"
    interval = 0.5

    async def snapshot(self) -> str:
        raise NotImplementedError

    async def start(self) -> None:
        await self.accept()
        VIEWER_SOCKETS_OPEN.inc()
        self.pusher = asyncio.create_task(self._push())

    async def _push(self) -> None:
        sent = None
        while True:
            try:
                text = await self.snapshot()
            except DatabaseError:
                # A transient failure (a locked SQLite table, a restarted database) must not end
                # the viewer's feed for good: the next interval tries again.
                logger.warning("live %s failed; retrying", self.feed, exc_info=True)
                text = sent
            if text != sent:
                await self.send(text)
                sent = text
            await asyncio.sleep(self.interval)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "pusher", None):  # accepted, and counted
            self.pusher.cancel()
            VIEWER_SOCKETS_OPEN.dec()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Viewers only listen."""
