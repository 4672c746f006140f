"""Leaderboards from the rolled-up contribution events, respecting each volunteer's visibility; the live feed."""

import datetime
import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from accounts.services import team_create
from portal.asgi import application
from runs.credit import boards, live
from runs.credit.rollup import credit_rollup
from runs.credit.schemas import LeaderboardRow, LiveSnapshot
from tests.factories import RunFactory, UserFactory, report, session_for


def contribute(run, user, samples: int, *, seq: int = 1, ago: datetime.timedelta = datetime.timedelta()):
    """``samples`` of ``user``'s machine number ``seq`` in epoch 3, reported and confirmed ``ago``."""
    report(session_for(run, user, machine=f"machine-{seq}"), samples, epoch=3,
           at=datetime.datetime.now(datetime.UTC) - ago)


@pytest.fixture
def board(db):
    run = RunFactory(slug="board-run")
    amina, vik = UserFactory(username="amina"), UserFactory(username="vik", display_name="Vik the Brave")
    shy, ghost = UserFactory(username="shy", visibility="anonymous"), UserFactory(username="ghost", visibility="hidden")
    team = team_create(founder=amina, name="Dhaka Compute")
    team_create(founder=vik, name="Solo")
    from accounts.services import team_join

    team_join(user=ghost, team=team)
    contribute(run, amina, 300)
    contribute(run, vik, 200)
    contribute(run, shy, 100)
    contribute(run, ghost, 50)
    contribute(run, vik, 1000, seq=2, ago=datetime.timedelta(days=3))
    credit_rollup()
    return run, shy


def test_the_board_ranks_volunteers_and_hides_who_asked(client, board):
    run, shy = board
    rows = client.get("/api/v1/runs/board-run/leaderboard").json()
    assert [(row["rank"], row["name"], row["samples"]) for row in rows] == [
        (1, "Vik the Brave", 1200), (2, "amina", 300), (3, shy.pseudonym, 100)
    ]
    assert rows[0]["machines"] == 2
    assert abs(rows[0]["share"] - 1200 / 1650) < 1e-9, "the hidden volunteer still counts in the total"
    assert "ghost" not in json.dumps(rows)


def test_windows_count_only_recent_work(client, board):
    rows = client.get("/api/v1/runs/board-run/leaderboard?window=24h").json()
    assert rows[0] == {**rows[0], "name": "amina", "samples": 300}


def test_teams_add_up_their_members_including_hidden_ones(client, board):
    rows = client.get("/api/v1/runs/board-run/leaderboard?by=team").json()
    assert [(row["name"], row["samples"]) for row in rows] == [("Solo", 1200), ("Dhaka Compute", 350)]


def test_a_bad_window_is_a_400(client, board):
    assert client.get("/api/v1/runs/board-run/leaderboard?window=1y").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_the_live_feed_pushes_a_snapshot_with_the_board():
    run = RunFactory(slug="live-run")
    contribute(run, UserFactory(username="amina"), 64)
    credit_rollup()

    async def first_snapshot():
        communicator = WebsocketCommunicator(application, "/ws/runs/live-run/live/", headers=[(b"origin", b"http://127.0.0.1")])
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        snapshot = json.loads(await communicator.receive_from(timeout=10))
        await communicator.disconnect()
        return snapshot

    snapshot = async_to_sync(first_snapshot)()
    assert snapshot["leaderboard"][0]["name"] == "amina"
    assert snapshot["alive_peers"] == 1 and snapshot["epoch"] == 3
    assert LiveSnapshot.model_validate(snapshot).model_dump(mode="json") == snapshot, "the frame is the board schema LiveSnapshot"


@pytest.mark.parametrize("path", ["/api/v1/runs/board-run/leaderboard", "/api/v1/runs/board-run/leaderboard?by=team",
                                  "/api/v1/leaderboard?window=7d", "/api/v1/leaderboard?by=team"])
def test_board_rows_are_the_protocols_leaderboard_rows(client, board, path):
    rows = client.get(path).json()
    assert rows
    for row in rows:
        LeaderboardRow.model_validate(row)  # no field unknown to the schema, none missing, all in range
        assert set(row) == set(LeaderboardRow.model_fields), "every field the schema names is sent"


@pytest.mark.django_db(transaction=True)
def test_the_live_feed_refuses_foreign_origins_and_hidden_drafts():
    RunFactory(slug="draft-run", status="draft")

    async def connects(path: str, origin: bytes) -> bool:
        communicator = WebsocketCommunicator(application, path, headers=[(b"origin", origin)])
        connected, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected

    assert not async_to_sync(connects)("/ws/runs/draft-run/live/", b"http://127.0.0.1")
    RunFactory(slug="open-run")
    assert not async_to_sync(connects)("/ws/runs/open-run/live/", b"http://evil.example")


async def _board_frames(path: str, between=None, until=None) -> tuple[dict, dict | None]:
    """The first frame of ``path``; then, after calling ``between`` (in a thread), the first frame that
    ``until`` accepts. Frames come whenever the snapshot changes, and a row's decaying average credit
    changes it every push: on a loaded host one such frame came before ``between`` had committed."""
    from channels.db import database_sync_to_async

    communicator = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://127.0.0.1")])
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    try:
        first = json.loads(await communicator.receive_from(timeout=10))
        if between is None:
            return first, None
        await database_sync_to_async(between, thread_sensitive=False)()
        deadline = time.monotonic() + 10
        while True:
            frame = json.loads(await communicator.receive_from(timeout=max(0.1, deadline - time.monotonic())))
            if until(frame):
                return first, frame
    finally:
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
def test_the_board_across_runs_is_live_and_pushes_confirmed_work_as_it_is_counted():
    from runs.credit.milestones import VOLUNTEER_THRESHOLDS
    from runs.credit.schemas import BoardSnapshot

    first, second = RunFactory(slug="first-run"), RunFactory(slug="second-run")
    amina, rahim = UserFactory(username="amina"), UserFactory(username="rahim")
    contribute(first, amina, 64)
    credit_rollup()
    milestone = VOLUNTEER_THRESHOLDS["samples"][0]

    def rahim_trains_in_another_run():
        contribute(second, rahim, milestone, seq=2)
        credit_rollup()

    before, after = async_to_sync(_board_frames)("/ws/leaderboard/live/?by=user&window=all", rahim_trains_in_another_run,
                                                 lambda frame: len(frame["leaderboard"]) > 1)
    assert [(row["name"], row["samples"]) for row in before["leaderboard"]] == [("amina", 64)]
    assert [(row["name"], row["samples"]) for row in after["leaderboard"]] == [("rahim", milestone), ("amina", 64)]
    assert {"measure": "samples", "threshold": milestone} in after["leaderboard"][0]["milestones"]
    assert after["leaderboard"][1]["milestones"] == []
    assert BoardSnapshot.model_validate(after).model_dump(mode="json") == after, "the frame is the board schema BoardSnapshot"
    teams, _ = async_to_sync(_board_frames)("/ws/leaderboard/live/?by=team&window=24h")
    assert (teams["by"], teams["window"], teams["leaderboard"]) == ("team", "24h", [])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["by=robots", "window=1y", "by=user&window=forever"])
def test_the_live_board_refuses_a_choice_it_does_not_have(query):
    async def close_code() -> int:
        communicator = WebsocketCommunicator(application, f"/ws/leaderboard/live/?{query}",
                                             headers=[(b"origin", b"http://127.0.0.1")])
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect()
        assert not connected
        return code

    assert async_to_sync(close_code)() == 4400


def test_the_page_and_the_api_show_a_badge_next_to_a_name_that_reached_a_milestone(client, board):
    from runs.credit.milestones import VOLUNTEER_THRESHOLDS

    run, _ = board
    milestone = VOLUNTEER_THRESHOLDS["samples"][0]  # vik's 1,200 confirmed samples passed it; amina's 300 did not
    rows = {row["name"]: row for row in client.get("/api/v1/runs/board-run/leaderboard").json()}
    assert rows["Vik the Brave"]["milestones"][0] == {"measure": "samples", "threshold": milestone}
    assert rows["amina"]["milestones"] == []
    page = client.get("/leaderboard/").content.decode()
    vik_row = page.split('data-name="Vik the Brave"')[1].split("</tr>")[0]
    assert 'class="milestone milestone-samples"' in vik_row
    assert "milestone" not in page.split('data-name="amina"')[1].split("</tr>")[0]


def test_live_snapshot_round_trips_through_json():
    snapshot = LiveSnapshot(
        leaderboard=[{"rank": 1, "name": "vik", "profile_url": "/volunteers/vik/", "samples": 1024, "credit": 12.0,
                      "credit_verified": 100.5, "recent_average_credit": 3.5, "compute_seconds": 60.0, "share": 0.75,
                      "machines": 2, "last_seen": datetime.datetime(2025, 5, 1, tzinfo=datetime.UTC)}],
        totals={"samples": 1024, "credit": 12.0, "volunteers": 1},
        samples_per_second=88.0, alive_peers=3, epoch=41, loss=None, pace_source="monitor")
    assert snapshot.model_dump(mode="json")["type"] == "snapshot"
    assert LiveSnapshot.model_validate_json(snapshot.model_dump_json()) == snapshot


@pytest.mark.django_db(transaction=True)
def test_viewers_of_one_run_share_one_read_per_interval_and_each_gets_a_change(monkeypatch):
    """One poller per run in the process reads the snapshot and hands each new one to every viewer
    (portal/live.py's SharedSnapshot): viewers no longer poll each on their own."""
    run = RunFactory(slug="shared-run")
    contribute(run, UserFactory(username="amina"), 64)
    credit_rollup()
    vik = UserFactory(username="vik")
    reads = []
    monkeypatch.setattr(live, "run_snapshot", lambda run: reads.append(run.pk) or boards.run_snapshot(run=run))

    async def three_viewers():
        viewers = [WebsocketCommunicator(application, "/ws/runs/shared-run/live/", headers=[(b"origin", b"http://127.0.0.1")])
                   for _ in range(3)]
        for viewer in viewers:
            assert (await viewer.connect(timeout=10))[0]
        first = [json.loads(await viewer.receive_from(timeout=10)) for viewer in viewers]
        await database_sync_to_async(contribute)(run, vik, 32, seq=2)
        await database_sync_to_async(credit_rollup)()
        changed = [json.loads(await viewer.receive_from(timeout=10)) for viewer in viewers]
        for viewer in viewers:
            await viewer.disconnect()
        return first, changed

    began = time.monotonic()
    first, changed = async_to_sync(three_viewers)()
    assert first[0] == first[1] == first[2] and changed[0] == changed[1] == changed[2] != first[0]
    assert changed[0]["totals"]["samples"] == 96
    assert len(reads) <= 2 + (time.monotonic() - began) / live.PUSH_INTERVAL, "one read per interval for all three"
