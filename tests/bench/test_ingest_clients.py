"""bench/ingest.py's client processes: agents split over processes report to a server as one, and what every
report became comes back merged (sent, answered, lost, answered twice), with the agents' sequence numbers."""

import functools
import json

import pytest

from bench.ingest import Agent, drive_split, report_frame
from tests.bench.loopback import serving

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def acking_server():
    """A websocket server on loopback that acknowledges every report by its seq, as the agent socket does."""
    async def acknowledge(ws) -> None:
        async for text in ws:
            await ws.send(json.dumps({"type": "ack", "seq": json.loads(text)["seq"]}))

    with serving(acknowledge) as url:
        yield url


def test_agents_split_over_processes_report_as_one_and_every_report_is_answered_once(acking_server):
    agents = [Agent(secret=f"dlp_{i}", session_id=i) for i in range(12)]
    frame = functools.partial(report_frame, samples=8)
    tally = drive_split(acking_server, "/ws/agent/", agents, frame, warmup=0.2, seconds=1.0, rate=120.0, processes=3)
    assert len(tally.busy) == 3  # one figure per client process
    assert tally.sent == sum(agent.seq for agent in agents) >= 12 + 100  # the first reports, then ~120/s for 1.2 s
    assert (tally.answers, tally.unanswered, tally.doubles, tally.refused) == (tally.sent, 0, 0, 0)
    assert len(tally.joins) == 12 and tally.latencies and not tally.errors
