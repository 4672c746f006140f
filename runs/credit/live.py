"""`WS /ws/runs/{slug}/live/`: the run's leaderboard and pace; `WS /ws/leaderboard/live/`: the board
across all runs. Each is pushed at most twice a second."""

from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from portal.live import PushingConsumer, cached_snapshot
from runs.access.rules import visible_run
from runs.credit.boards import BY, WINDOWS, board_snapshot, run_snapshot
from runs.models import Run

PUSH_INTERVAL = 0.5


async def snapshot_text(run: Run) -> str:
    return await cached_snapshot(("run", run.pk), lambda: run_snapshot(run=run), PUSH_INTERVAL)


class RunLiveConsumer(PushingConsumer):
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


class BoardLiveConsumer(PushingConsumer):
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
        return await cached_snapshot(("board", self.by, self.window),
                                     lambda: board_snapshot(by=self.by, window=self.window), PUSH_INTERVAL)
