"""The portal's agent-facing wire as the tests speak it: the JSON API with a bearer token, and
reports over `WS /ws/agent/` (what tests/runs/ingest/test_agent_socket.py and the ingest and security
tests send)."""

import datetime
import json

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db.models import Sum

from portal.asgi import application
from runs.models import ContributionEvent


def post(client, url: str, secret: str, body: dict | None = None, raw: str | None = None):
    """POST ``body`` as JSON (or ``raw`` as it is) to the agent API with the agent token ``secret``."""
    return client.post(
        url, data=raw if raw is not None else json.dumps(body or {}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


# Reports as an agent at 12.5 samples/s sends them: 32 samples every 2.56 s by its clock, which
# is what the plausibility rules (runs.ingest.reports.RULES) expect; seq 0 would have gone out 200 s ago.
def report(session_id: int, seq: int, samples: int = 32, **changes) -> dict:
    sent_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2.56 * seq - 200)
    frame = {
        "type": "report", "session_id": session_id, "seq": seq, "samples": samples, "steps": 4, "local_epoch": 2,
        "loss": 7.5, "samples_per_second": 12.5, "sent_at": sent_at.isoformat(),
    }
    return {**frame, **changes}


def exchange(secret: str | None, frames: list, *, headers=None) -> list[dict]:
    """Connect, send each frame (dicts as JSON, strings raw), and return every answer. A function
    among the frames is called in between, on the database, as another request would."""

    async def run() -> list[dict]:
        auth = [(b"authorization", f"Bearer {secret}".encode())] if secret else []
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers if headers is not None else auth)
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        answers = []
        try:
            if not secret or headers is not None:
                answers.append(json.loads(await communicator.receive_from(timeout=10)))
                return answers
            for frame in frames:
                if callable(frame):
                    await database_sync_to_async(frame)()
                    continue
                await communicator.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))
                answers.append(json.loads(await communicator.receive_from(timeout=10)))
        finally:
            await communicator.disconnect()
        return answers

    return async_to_sync(run)()


def total(session) -> int:
    """The samples stored for ``session``."""
    return ContributionEvent.objects.filter(session=session).aggregate(total=Sum("samples"))["total"] or 0
