"""Board rows and live frames: what the portal sends to browsers and API readers, never to an agent.

The agent's wire contract (peer_agent/protocol.py) holds only what crosses the wire between portal and agent;
these schemas describe the public boards of ``GET /api/v1/.../leaderboard`` (runs/api/routes.py) and the frames
of ``/ws/runs/{slug}/live/`` and ``/ws/leaderboard/live/`` (runs/credit/live.py), which runs/credit/boards.py builds.
"""

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field


class BoardSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class MilestoneMark(BoardSchema):
    """A milestone badge shown next to a name on a board: the highest threshold of one measure that
    the volunteer's or team's confirmed work reached on that board (docs/volunteers.md)."""

    measure: Literal["samples", "credit"] = Field(description="Confirmed samples, or confirmed credit in GFLOP.")
    threshold: int = Field(ge=1, description="The threshold reached.")


class LeaderboardRow(BoardSchema):
    """One volunteer or team on a board: rows of ``GET /api/v1/runs/{slug}/leaderboard`` and
    ``GET /api/v1/leaderboard``, and of the live frames. Credit is confirmed work in GFLOP of training
    (docs/volunteers.md); pending credit is its owner's business and never on a board."""

    rank: int = Field(ge=1, description="Position, 1 for the top.")
    name: str = Field(max_length=200, description="Public name of the volunteer or team.")
    profile_url: str | None = Field(description="Path of the volunteer's or team's public page.")
    samples: int = Field(ge=0, description="Confirmed samples in the window.")
    credit: float = Field(ge=0, description="Confirmed credit in the window, GFLOP.")
    credit_verified: float = Field(ge=0, description="Credit confirmed from the peer's signed progress in the DHT, all time.")
    recent_average_credit: float = Field(ge=0, description="Credit per day, decaying with a half-life of a week.")
    compute_seconds: float = Field(ge=0, description="Training time reported, all time.")
    share: float = Field(ge=0, description="Share of the board's credit in the window.")
    last_seen: AwareDatetime | None = Field(description="Latest report, if any.")
    machines: int = Field(ge=0, description="Machines that contributed (a team's: of its members in the window).")
    members: int | None = Field(None, ge=0, description="Members who contributed in the window (teams only).")
    milestones: list[MilestoneMark] = Field(
        default_factory=list, max_length=2, description="Badges reached on this board, the highest of each measure.")


class LiveTotals(BoardSchema):
    """The run's confirmed work so far."""

    samples: int = Field(ge=0, description="Confirmed samples.")
    credit: float = Field(ge=0, description="Confirmed credit, GFLOP.")
    volunteers: int = Field(ge=0, description="Volunteers with confirmed work.")


class LiveSnapshot(BoardSchema):
    """A frame of ``/ws/runs/{slug}/live/``, and what the run page renders first."""

    type: Literal["snapshot"] = Field("snapshot", description="Frame type.")
    leaderboard: list[LeaderboardRow] = Field(description="The top of the board, best first.")
    totals: LiveTotals = Field(description="The run's confirmed work.")
    samples_per_second: float = Field(ge=0, description="Throughput of the whole collaboration.")
    alive_peers: int = Field(ge=0, description="Peers training now.")
    epoch: int | None = Field(ge=0, description="Current collaboration epoch, if known.")
    loss: float | None = Field(description="Recent loss of the collaboration, if known.")
    pace_source: Literal["monitor", "reports"] = Field(
        description="Where the pace comes from: the monitor's reading of the swarm, or the agents' reports of the last minute.")


class BoardSnapshot(BoardSchema):
    """A frame of ``/ws/leaderboard/live/``: the board across all runs, as ``/leaderboard/`` shows it."""

    type: Literal["board"] = Field("board", description="Frame type.")
    by: Literal["user", "team"] = Field(description="Volunteers or teams.")
    window: Literal["24h", "7d", "all"] = Field(description="The window the board counts credit in.")
    leaderboard: list[LeaderboardRow] = Field(description="The top of the board, best first.")
