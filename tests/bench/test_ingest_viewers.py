"""bench/ingest.py's viewers: what each client process's viewers received merges into one tally, and every
(viewer, rollup commit) pair is counted once, as delivered after so long or as never delivered."""

import asyncio
import json
import time

import pytest

from bench.ingest import ViewerTally, rollup_deliveries, snapshot_spread, view
from tests.bench.loopback import serving

pytestmark = pytest.mark.timeout(60)


def test_a_commit_counts_from_its_time_to_each_viewers_first_frame_showing_it_and_viewers_without_one_never():
    commits = [(10.0, 100), (12.0, 150), (13.0, 150), (14.0, 200)]  # the first is what viewers had before
    frames = [
        [(12.3, 1, 150), (14.5, 2, 200)],
        [(12.9, 1, 150), (13.5, 3, 150)],  # never shows 200
        [(14.2, 2, 200)],  # shows 150's commit only through a later frame
        [],
    ]
    delays, never = rollup_deliveries(frames, commits)
    assert delays == pytest.approx(sorted([0.3, 0.9, 2.2, 0.5, 0.2])), "the commit that moved nothing is skipped"
    assert never == 3 and len(delays) + never == len(frames) * 2


def test_viewer_tallies_of_processes_merge_and_the_spread_is_of_the_frames_in_the_window():
    tally, other = ViewerTally(frames=[[(1.0, 7, 0)]], busy=[0.5]), ViewerTally(frames=[[(1.25, 7, 0), (9.0, 8, 0)]],
                                                                               busy=[0.25])
    other.errors["connect: TimeoutError"] += 1
    tally.merge(other)
    assert len(tally.frames) == 2 and tally.busy == [0.5, 0.25] and tally.errors == {"connect: TimeoutError": 1}
    delivered, first_seen, spread = snapshot_spread(tally.frames, began=0.0, ended=5.0)
    assert delivered == [(1.0, 7), (1.25, 7)] and first_seen == {7: 1.0} and spread == [0.0, 0.25]


@pytest.fixture
def pushing_server():
    """A websocket server on loopback that pushes a run's live snapshot, its confirmed samples rising, every 50 ms."""
    async def push(ws) -> None:
        for samples in range(1000):
            await ws.send(json.dumps({"type": "snapshot", "totals": {"samples": samples}}))
            await asyncio.sleep(0.05)

    with serving(push) as url:
        yield url


def test_viewers_record_each_frame_with_the_samples_it_shows_only_between_go_and_done(pushing_server):
    said = []
    tally = asyncio.run(view(pushing_server, "a-run", 5, 50.0, lambda: said.append("ready"), lambda: time.sleep(0.2),
                             lambda: time.sleep(0.5)))
    assert said == ["ready"] and not tally.errors and len(tally.frames) == 5 and len(tally.busy) == 1
    for frames in tally.frames:
        assert 5 <= len(frames) <= 15, "about 10 frames in 0.5 s"
        shown = [samples for _, _, samples in frames]
        assert shown == sorted(shown) and shown[0] > 0, "not the frames before recording began"
