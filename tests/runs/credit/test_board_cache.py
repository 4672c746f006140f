"""Boards are served from a cache keyed by the boards' version (runs/credit/boards.py): the same rows as an
uncached read, and never a stale one after the rollup moves the totals or a volunteer hides or renames."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.services import team_create
from runs.credit import boards
from runs.credit.boards import board_rows, leaderboard_rows, run_snapshot
from runs.credit.rollup import credit_rollup
from tests.factories import RunFactory, UserFactory, report, session_for


@pytest.fixture
def board(db, clock):
    run = RunFactory(slug="cached-run")
    amina, badal = UserFactory(username="amina", display_name="Amina R."), UserFactory(username="badal")
    team_create(founder=amina, name="Dhaka Compute")
    report(session_for(run, amina), 300)
    report(session_for(run, badal), 200)
    credit_rollup()
    return run, amina, badal


def names(rows):
    return [(row["rank"], row["name"], row["samples"]) for row in rows]


@pytest.mark.parametrize("by, window", [("user", "all"), ("user", "24h"), ("team", "7d")])
def test_a_cached_board_is_the_uncached_read_and_costs_one_query(board, by, window):
    run = board[0]
    for scope in (run, None):
        first = board_rows(run=scope, by=by, window=window)
        assert first == leaderboard_rows(run=scope, by=by, window=window) and first
        with CaptureQueriesContext(connection) as queries:
            assert board_rows(run=scope, by=by, window=window) == first
        assert len(queries) == 1, "a hit reads the boards' version and nothing else"


def test_the_rollup_moving_the_totals_is_seen_at_once(board):
    run, amina, badal = board
    assert names(board_rows(run=run)) == [(1, "Amina R.", 300), (2, "badal", 200)]
    report(session_for(run, badal, machine="second"), 400)
    assert names(board_rows(run=run)) == [(1, "Amina R.", 300), (2, "badal", 200)], "not rolled up yet"
    credit_rollup()
    assert names(board_rows(run=run)) == [(1, "badal", 600), (2, "Amina R.", 300)]
    assert board_rows(run=run) == leaderboard_rows(run=run)


def test_a_volunteer_who_hides_or_renames_is_off_every_cached_board_at_once(board):
    """No rollup pass between: the profile's save itself moves the boards' version."""
    run, amina, badal = board
    board_rows(run=run), board_rows(run=None)
    amina.display_name = "A. Rahman"
    amina.save()
    assert names(board_rows(run=run))[0] == (1, "A. Rahman", 300)
    amina.visibility = "hidden"
    amina.save(update_fields=["visibility"])
    for scope in (run, None):
        assert names(board_rows(run=scope)) == [(1, "badal", 200)]
        assert board_rows(run=scope) == leaderboard_rows(run=scope)


def test_a_renamed_team_is_seen_at_once_and_a_login_keeps_the_cache(board):
    run, amina, _ = board
    assert board_rows(run=run, by="team")[0]["name"] == "Dhaka Compute"
    amina.team.name = "Chittagong Compute"
    amina.team.save()
    assert board_rows(run=run, by="team")[0]["name"] == "Chittagong Compute"
    amina.save(update_fields=["last_login"])
    with CaptureQueriesContext(connection) as queries:
        board_rows(run=run, by="team")
    assert len(queries) == 1, "a field no board shows leaves the cached boards alone"


def test_boards_are_read_afresh_while_the_cache_is_away(board, monkeypatch):
    """A restarting Redis must not fail a board, nor end a live page's feed (tests/e2e/test_faults.py saw one
    go silent for good when the cache raised into it)."""
    run = board[0]

    def away(*args, **kwargs):
        raise ConnectionError("the cache is restarting")

    monkeypatch.setattr(boards.cache, "get", away)
    monkeypatch.setattr(boards.cache, "set", away)
    assert board_rows(run=run) == leaderboard_rows(run=run)
    assert names(run_snapshot(run=run)["leaderboard"]) == names(leaderboard_rows(run=run, limit=50))
