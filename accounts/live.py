"""`WS /ws/notifications/live/`: the bell's unread count for the signed-in volunteer, pushed when it
changes (static/js/bell.js), so a notice made by the worker shows without a reload, and only while
the volunteer stays signed in."""

import json

from channels.db import database_sync_to_async

from accounts.selectors import notification_unread_count
from portal.live import PushingConsumer, current_viewer

# One indexed count per open tab every few seconds. Not cached across tabs as boards are: a count
# cached when one tab marked a notice read would be pushed stale to the page that tab loads next.
BELL_INTERVAL = 5.0


class NotificationsLiveConsumer(PushingConsumer):
    feed = "unread notifications"
    interval = BELL_INTERVAL
    refusal_code = 4401  # static/js/bell.js then stops asking

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=self.refusal_code)
            return
        await self.start()

    async def snapshot(self) -> str:
        unread = await database_sync_to_async(notification_unread_count, thread_sensitive=False)(user=self.user)
        return json.dumps({"unread": unread})

    async def may_watch(self) -> bool:
        """While the session that opened the feed still names the volunteer: not once they signed out
        (in any tab), were deactivated or changed their password elsewhere."""
        return (await current_viewer(self.scope)).pk == self.user.pk
