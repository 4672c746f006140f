"""`WS /ws/runs/{slug}/live/`: the run's leaderboard and pace, pushed at most twice a second."""

import asyncio
import json
import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from portal.metrics import VIEWER_SOCKETS_OPEN
from runs.access.rules import visible_run
from runs.credit.boards import run_snapshot
from runs.models import Run

logger = logging.getLogger(__name__)
PUSH_INTERVAL = 0.5

# One snapshot per run per interval in this process, however many people watch.
_snapshots: dict[int, tuple[float, str]] = {}
_locks: dict[int, asyncio.Lock] = {}


async def snapshot_text(run: Run) -> str:
    lock = _locks.setdefault(run.pk, asyncio.Lock())
    async with lock:
        cached = _snapshots.get(run.pk)
        if cached and time.monotonic() - cached[0] < PUSH_INTERVAL:
            return cached[1]
        snapshot = await database_sync_to_async(run_snapshot, thread_sensitive=False)(run=run)
        text = json.dumps(snapshot)
        _snapshots[run.pk] = (time.monotonic(), text)
        return text


class RunLiveConsumer(AsyncWebsocketConsumer):
    # Each viewer polls the per-run cached snapshot (at most 2 Hz) and never hears from a group,
    # so it needs no channel layer: with Redis, one blocking read per viewer timed out at 500 viewers.
    channel_layer_alias = None

    async def connect(self) -> None:
        slug = self.scope["url_route"]["kwargs"]["slug"]
        self.run = await database_sync_to_async(visible_run)(slug=slug, user=self.scope.get("user"))
        if self.run is None:
            await self.close(code=4404)
            return
        await self.accept()
        VIEWER_SOCKETS_OPEN.inc()
        self.pusher = asyncio.create_task(self._push())

    async def _push(self) -> None:
        sent = None
        while True:
            try:
                text = await snapshot_text(self.run)
            except DatabaseError:
                # A transient failure (a locked SQLite table, a restarted database) must not end
                # the viewer's feed for good: the next interval tries again.
                logger.warning("live snapshot of run %s failed; retrying", self.run.slug, exc_info=True)
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
