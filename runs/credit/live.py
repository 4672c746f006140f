"""`WS /ws/runs/{slug}/live/`: the run's leaderboard and pace, for whoever may see the run, asked again
every few seconds; `WS /ws/leaderboard/live/`: the board across all runs, everyone's. Each is pushed
at most twice a second, read once for all the viewers of a snapshot in the process."""

from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from portal.live import PushingConsumer, SharedSnapshot, cached, current_viewer
from runs.access.rules import run_may_view, run_seen_by_all, visible_run
from runs.credit.boards import BY, WINDOWS, board_snapshot, run_snapshot
from runs.models import Run

PUSH_INTERVAL = 0.5


class RunLiveConsumer(PushingConsumer):
    refusal_code = 4404  # as for a run that does not exist

    async def connect(self) -> None:
        slug = self.scope["url_route"]["kwargs"]["slug"]
        self.run = await database_sync_to_async(visible_run, thread_sensitive=False)(slug=slug, user=self.scope.get("user"))
        if self.run is None:
            await self.close(code=self.refusal_code)
            return
        self.feed = f"snapshot of run {self.run.slug}"
        run = self.run
        self.shared = SharedSnapshot.join(("run", run.pk), lambda: run_snapshot(run=run), PUSH_INTERVAL)
        await self.start()

    async def may_watch(self) -> bool:
        """The run's row is read once per recheck for all its viewers; only a run not seen by all
        (members only) asks about the viewer, who may have been banned, dropped from its list or
        signed out since the feed opened."""
        run = await cached(("run row", self.run.pk), lambda: Run.objects.filter(pk=self.run.pk).first(),
                           self.recheck)
        if run is None:
            return False
        if run_seen_by_all(run=run):
            return True
        viewer = await current_viewer(self.scope)
        return await database_sync_to_async(run_may_view, thread_sensitive=False)(run=run, user=viewer)


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
        by, window = self.by, self.window
        self.shared = SharedSnapshot.join(("board", by, window), lambda: board_snapshot(by=by, window=window),
                                          PUSH_INTERVAL)
        await self.start()
