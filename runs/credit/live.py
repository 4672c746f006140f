"""`WS /ws/runs/{slug}/live/`: the run's leaderboard and pace; `WS /ws/leaderboard/live/`: the board
across all runs. Each is pushed at most twice a second."""

import asyncio
import json
import logging
import time
from collections.abc import Callable, Hashable
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from portal.metrics import VIEWER_SOCKETS_OPEN
from runs.access.rules import visible_run
from runs.credit.boards import BY, WINDOWS, board_snapshot, run_snapshot
from runs.models import Run

logger = logging.getLogger(__name__)
PUSH_INTERVAL = 0.5

# One snapshot per board per interval in this process, however many people watch.
_snapshots: dict[Hashable, tuple[float, str]] = {}
_locks: dict[Hashable, asyncio.Lock] = {}


async def _cached(key: Hashable, compute: Callable[[], dict]) -> str:
    lock = _locks.setdefault(key, asyncio.Lock())
    async with lock:
        cached = _snapshots.get(key)
        if cached and time.monotonic() - cached[0] < PUSH_INTERVAL:
            return cached[1]
        snapshot = await database_sync_to_async(compute, thread_sensitive=False)()
        text = json.dumps(snapshot)
        _snapshots[key] = (time.monotonic(), text)
        return text


async def snapshot_text(run: Run) -> str:
    return await _cached(("run", run.pk), lambda: run_snapshot(run=run))


class _PushingConsumer(AsyncWebsocketConsumer):
    """A viewer's feed: the current snapshot, then each one that differs, polled every interval.
    Each viewer polls the cached snapshot (at most 2 Hz per board) and never hears from a group,
    so it needs no channel layer: with Redis, one blocking read per viewer timed out at 500 viewers."""

    channel_layer_alias = None
    feed = "snapshot"

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
            await asyncio.sleep(PUSH_INTERVAL)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "pusher", None):  # accepted, and counted
            self.pusher.cancel()
            VIEWER_SOCKETS_OPEN.dec()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Viewers only listen."""


class RunLiveConsumer(_PushingConsumer):
    async def connect(self) -> None:
        slug = self.scope["url_route"]["kwargs"]["slug"]
        self.run = await database_sync_to_async(visible_run)(slug=slug, user=self.scope.get("user"))
        if self.run is None:
            await self.close(code=4404)
            return
        self.feed = f"snapshot of run {self.run.slug}"
        await self.start()

    async def snapshot(self) -> str:
        return await snapshot_text(self.run)


class BoardLiveConsumer(_PushingConsumer):
    """The board across all runs, for anyone (as the page is): ``?by=user|team&window=24h|7d|all``;
    any other choice is refused with 4400, before anything is read."""

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.by, self.window = query.get("by", ["user"])[-1], query.get("window", ["all"])[-1]
        if self.by not in BY or self.window not in WINDOWS:
            await self.close(code=4400)
            return
        self.feed = f"board by {self.by} over {self.window}"
        await self.start()

    async def snapshot(self) -> str:
        return await _cached(("board", self.by, self.window), lambda: board_snapshot(by=self.by, window=self.window))
