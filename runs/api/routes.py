"""Run endpoints: the public listing and checkpoints, and joining, refreshing, data and bandwidth probes for peer agents."""

import datetime
import functools
import os
import re
from typing import Literal

from django.http import FileResponse, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.cache import patch_cache_control
from ninja import Field, Path, Query, Router, Schema
from pydantic import field_validator

from accounts.auth import AgentBearer
from accounts.models import AgentToken
from accounts.services import token_check_scope
from peer_agent.protocol import JoinRequest, JoinResponse, MachineCredit, RefreshResponse
from portal.errors import ApiError, answers
from portal.ratelimit import rate_limit_hit
from runs.access.rules import (
    JoinRefused,
    run_join_refusal,
    run_list_public,
    run_may_download_checkpoints,
    run_may_view,
    run_seen_by_all,
    visible_run,
)
from runs.access.sessions import session_link_target, session_link_token, session_open, session_refresh
from runs.credit.boards import PAGE_MAX, board_rows
from runs.credit.exports import stats_dumps
from runs.credit.schemas import LeaderboardRow
from runs.credit.volunteers import machine_credit, volunteer_daily, volunteer_for_profile
from runs.evaluation.probe_scores import probe_score_rows
from runs.evaluation.selectors import evaluation_row, evaluations_of
from runs.models import Checkpoint, Run, TrainingSession
from runs.swarm.series import series_points

router = Router(tags=["runs"])

# What an agent token can be refused with on every agent endpoint (accounts/services.py): no usable
# token, a disabled account or a token limited to another run, too many refused tokens from one address.
AGENT_AUTH = (401, 403, 429)
Slug = Path[str, {"pattern": r"^[-a-zA-Z0-9_]+$", "max_length": 64}]  # Run.slug, a SlugField


class RunSummary(Schema):
    slug: str
    name: str
    description: str
    status: str
    visibility: str
    organizers: list[str]
    config: dict
    tokenizer_status: str


def _summary(run: Run) -> dict:
    return {
        "slug": run.slug,
        "name": run.name,
        "description": run.description,
        "status": run.status,
        "visibility": run.visibility,
        "organizers": [user.public_name or "a hidden volunteer" for user in run.organizers.all()],
        "config": run.config,
        "tokenizer_status": run.tokenizer_status,
    }


def _visible_run(request: HttpRequest, slug: str, *, joining: bool = False) -> Run:
    """The run, if the caller may see it, or (``joining``) may train in it; else the same 404 as a
    run that does not exist. The caller is the agent token's owner on agent endpoints."""
    user = request.auth.user if isinstance(getattr(request, "auth", None), AgentToken) else request.user
    run = visible_run(slug=slug, user=user, joining=joining)
    if run is None:
        raise ApiError(404, "run_not_found", f"there is no run “{slug}”; check its name on the portal's runs page")
    return run


def _refused(refusal: JoinRefused) -> ApiError:
    return ApiError(refusal.status, refusal.code, refusal.detail, refusal.retry_after)


def _everyones(response: HttpResponse) -> None:
    """Mark an answer that every reader is given alike (the run list, a board of a run anyone may see), so
    that it may be kept and sent again without reading the database (portal/snapshots.py, for anonymous
    readers). ``max-age=0``: a browser asks again, since the boards move at every rollup pass."""
    patch_cache_control(response, public=True, max_age=0)


def _absolute(request: HttpRequest, path: str, scheme: str | None = None) -> str:
    url = request.build_absolute_uri(path)
    if scheme == "ws":
        url = "ws" + url.removeprefix("http")
    return url


@router.get("/runs/", response=answers(list[RunSummary]), summary="Public runs")
def run_list(request: HttpRequest, response: HttpResponse):
    _everyones(response)
    return [_summary(run) for run in run_list_public()]


@router.get("/runs/{slug}/", response=answers(RunSummary, 400, 404), summary="A run's summary and configuration")
def run_detail(request: HttpRequest, response: HttpResponse, slug: Slug):
    run = _visible_run(request, slug)
    if run_seen_by_all(run=run):
        _everyones(response)
    return _summary(run)


@router.post("/runs/{slug}/join", response=answers(JoinResponse, 400, *AGENT_AUTH, 404, 409), auth=AgentBearer(),
             summary="Join a run with a peer agent")
def run_join(request: HttpRequest, slug: Slug, body: JoinRequest):
    """Open a training session and sign a short-lived hivemind access token for the agent's peer key."""
    rate_limit_hit(name="join", key=str(request.auth.pk))
    run = _visible_run(request, slug, joining=True)
    token_check_scope(token=request.auth, run=run)
    try:
        session, access = session_open(run=run, token=request.auth, request=body)
    except JoinRefused as refusal:
        raise _refused(refusal) from None
    except ValueError as exc:
        raise ApiError(400, "invalid_peer_key", f"peer_public_key: {exc}") from None
    return {
        "session_id": session.pk,
        "role": session.role,
        "run_id": run.hivemind_run_id,
        "config": run.config,
        "hivemind_access": access,
        "authority_public_key": run.authority_public_key,
        "initial_peers": run.initial_peers,
        "report_url": _absolute(request, "/ws/agent/", scheme="ws"),
        "tokenizer_url": _absolute(request, f"/api/v1/runs/{run.slug}/tokenizer.json"),
        "data_files": [_data_file_url(request, session, data_file) for data_file in run.data_files.all()],
        "checkpoint_url": _checkpoint_url(request, session, run.checkpoints.first()),
    }


def _data_file_url(request: HttpRequest, session: TrainingSession, data_file) -> str:
    url_token = session_link_token(session=session, kind="data", target=data_file)
    return _absolute(request, f"/api/v1/data/{url_token}/{data_file.pk}.txt")


def _checkpoint_url(request: HttpRequest, session: TrainingSession, checkpoint: Checkpoint | None) -> str | None:
    if checkpoint is None:
        return None
    url_token = session_link_token(session=session, kind="checkpoint", target=checkpoint)
    return _absolute(request, f"/api/v1/checkpoints/{url_token}/{checkpoint.pk}.zip")


@router.post("/sessions/{session_id}/refresh", response=answers(RefreshResponse, 400, *AGENT_AUTH, 404, 409),
             auth=AgentBearer(), summary="Refresh hivemind access")
def session_refresh_endpoint(request: HttpRequest, session_id: int):
    rate_limit_hit(name="refresh", key=str(request.auth.pk))
    session = TrainingSession.objects.select_related("run").filter(pk=session_id, user=request.auth.user).first()
    if session is None:
        raise ApiError(404, "session_not_found", f"there is no training session {session_id} of yours; join the run again")
    token_check_scope(token=request.auth, run=session.run)
    try:
        return {"hivemind_access": session_refresh(session=session, token=request.auth)}
    except JoinRefused as refusal:
        raise _refused(refusal) from None


@router.get("/sessions/{session_id}/credit", response=answers(MachineCredit, 400, *AGENT_AUTH, 404),
            auth=AgentBearer(), summary="What this machine earned in the run")
def session_credit(request: HttpRequest, session_id: int):
    """The agent's own figures for its display: its machine's confirmed, pending and lost samples in the run."""
    session = TrainingSession.objects.select_related("run", "user").filter(pk=session_id, user=request.auth.user).first()
    if session is None:
        raise ApiError(404, "session_not_found", f"there is no training session {session_id} of yours")
    token_check_scope(token=request.auth, run=session.run)
    return machine_credit(session=session)


@router.get("/runs/{slug}/tokenizer.json", auth=AgentBearer(), summary="The run's tokenizer",
            response=answers(None, 400, *AGENT_AUTH, 404, 409))
def run_tokenizer(request: HttpRequest, slug: Slug):
    run = _visible_run(request, slug, joining=True)
    token_check_scope(token=request.auth, run=run)
    refusal = run_join_refusal(run=run, user=request.auth.user)
    if refusal and refusal.code != "run_paused":
        raise _refused(refusal)
    if run.tokenizer_status != Run.TokenizerStatus.READY:
        raise ApiError(409, "tokenizer_not_ready", f"run “{run.slug}” has no tokenizer yet")
    return FileResponse(run.tokenizer_file.open("rb"), content_type="application/json", filename="tokenizer.json")


@router.get("/data/{url_token}/{file_id}.txt", summary="One of a run's data files (signed link from the join answer)",
            response=answers(None, 400, 403, 404, 409))
def data_file_download(request: HttpRequest, url_token: str, file_id: int):
    try:
        data_file = session_link_target(url_token=url_token, kind="data")
    except JoinRefused as refusal:
        raise _refused(refusal) from None
    if data_file.pk != file_id:
        raise ApiError(404, "not_found", "this data link is not valid")
    return FileResponse(data_file.file.open("rb"), content_type="text/plain; charset=utf-8")


@router.get("/checkpoints/{url_token}/{checkpoint_id}.zip", response=answers(None, 400, 403, 404, 409),
            summary="A run's checkpoint (signed link from the join answer)")
def checkpoint_download_signed(request: HttpRequest, url_token: str, checkpoint_id: int):
    try:
        checkpoint = session_link_target(url_token=url_token, kind="checkpoint")
    except JoinRefused as refusal:
        raise _refused(refusal) from None
    if checkpoint.pk != checkpoint_id:
        raise ApiError(404, "not_found", "this checkpoint link is not valid")
    return FileResponse(checkpoint.file.open("rb"), as_attachment=True, content_type="application/zip",
                        filename=f"{checkpoint.run.slug}-epoch{checkpoint.epoch}.zip")


class CheckpointOut(Schema):
    epoch: int
    loss: float | None
    samples: int
    size: int
    kept: bool
    created_at: str
    download_url: str


@router.get("/runs/{slug}/checkpoints", response=answers(list[CheckpointOut], 400, 404),
            summary="A run's checkpoints, newest first")
def run_checkpoints(request: HttpRequest, slug: Slug):
    run = _visible_run(request, slug)
    if not run_may_download_checkpoints(run=run, user=request.user):
        raise ApiError(404, "run_not_found", f"there is no run “{slug}”; check its name on the portal's runs page")
    return [
        {"epoch": checkpoint.epoch, "loss": checkpoint.loss, "samples": checkpoint.samples, "size": checkpoint.size,
         "kept": checkpoint.kept, "created_at": checkpoint.created_at.isoformat(),
         "download_url": _absolute(request, reverse("run-checkpoint", args=[run.slug, checkpoint.epoch]))}
        for checkpoint in run.checkpoints.all()
    ]


class ProbeEpochOut(Schema):
    epoch: int
    samples: int
    score: float = Field(description="The mean over the fine-tunes' seeds, 0 to 1.")
    std: float | None = Field(description="The scores' standard deviation over the seeds; null from one seed.")
    seeds: int = Field(description="Fine-tunes from different seeds the score averages.")
    cpu_seconds: float
    wall_seconds: float


class ProbeScoresOut(Schema):
    name: str
    task: Literal["tokens", "text"]
    metric: Literal["f1", "accuracy"]
    labels: list[str]
    train_examples: int
    test_examples: int
    baseline: float | None = Field(description="The same fine-tune from a randomly initialized model, once per run "
                                               "(the mean over its seeds).")
    baseline_std: float | None = Field(description="The baseline's standard deviation over its seeds.")
    latest: ProbeEpochOut | None
    gain: float | None = Field(description="The newest score minus the baseline (means).")
    scores: list[ProbeEpochOut]


@router.get("/runs/{slug}/probes", response=answers(list[ProbeScoresOut], 400, 404),
            summary="A run's downstream probes: each checkpoint's score beside the random-init baseline")
def run_probes(request: HttpRequest, slug: Slug):
    return probe_score_rows(run=_visible_run(request, slug))


PROBE_DOWNLOAD_MAX = 8 << 20
PROBE_DOWNLOAD_DEFAULT = 4 << 20
PROBE_UPLOAD_MAX = 2 << 20
ProbeSize = Query[int, {"ge": 1, "le": PROBE_DOWNLOAD_MAX, "description": "Bytes to send."}]


@functools.cache
def _probe_bytes() -> bytes:
    """Random, so that no proxy can compress the transfer and fake the rate; drawn once per process."""
    return os.urandom(PROBE_DOWNLOAD_MAX)


class ProbeUploadOut(Schema):
    bytes: int


@router.get("/probe/download", auth=AgentBearer(), summary="Bytes for an agent to time its download",
            response=answers(None, 400, *AGENT_AUTH))
def probe_download(request: HttpRequest, size: ProbeSize = PROBE_DOWNLOAD_DEFAULT):
    response = HttpResponse(memoryview(_probe_bytes())[:size], content_type="application/octet-stream")
    response["Cache-Control"] = "no-store"
    return response


@router.post("/probe/upload", auth=AgentBearer(), response=answers(ProbeUploadOut, 400, *AGENT_AUTH, 413),
             summary="Receive bytes from an agent timing its upload")
def probe_upload(request: HttpRequest):
    """Count the raw body in chunks: ``request.body`` would raise past DATA_UPLOAD_MAX_MEMORY_SIZE."""
    too_big = ApiError(413, "probe_too_large", f"upload at most {PROBE_UPLOAD_MAX} bytes to the probe")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length must be a number of bytes") from None
    if declared > PROBE_UPLOAD_MAX:
        raise too_big
    received = 0
    while chunk := request.read(1 << 16):
        received += len(chunk)
        if received > PROBE_UPLOAD_MAX:
            raise too_big
    return {"bytes": received}


Page = Query[int, {"ge": 1, "le": PAGE_MAX}]
Offset = Query[int, {"ge": 0, "le": 10_000_000}]


def _board(run: Run | None, by: str, window: str, limit: int, offset: int) -> list[dict]:
    return board_rows(run=run, by=by, window=window, limit=limit, offset=offset)


@router.get("/runs/{slug}/leaderboard", response=answers(list[LeaderboardRow], 400, 404), summary="A run's leaderboard")
def run_leaderboard(request: HttpRequest, response: HttpResponse, slug: Slug, by: Literal["user", "team"] = "user",
                    window: Literal["24h", "7d", "all"] = "all", limit: Page = 100, offset: Offset = 0):
    """Credit is in GFLOP of training (see docs/volunteers.md); share is of the board's credit."""
    run = _visible_run(request, slug)
    if run_seen_by_all(run=run):
        _everyones(response)
    return _board(run, by, window, limit, offset)


@router.get("/leaderboard", response=answers(list[LeaderboardRow], 400), summary="The leaderboard across all runs")
def leaderboard(request: HttpRequest, response: HttpResponse, by: Literal["user", "team"] = "user",
                window: Literal["24h", "7d", "all"] = "all", limit: Page = 100, offset: Offset = 0):
    _everyones(response)
    return _board(None, by, window, limit, offset)


class ContributionDayOut(Schema):
    day: str
    samples: int
    credit: float


@router.get("/volunteers/{key}/contributions", response=answers(list[ContributionDayOut], 404),
            summary="A volunteer's samples and credit per day, across runs")
def volunteer_contributions(request: HttpRequest, key: str):
    user = volunteer_for_profile(key=key, viewer=request.user)
    if user is None:
        raise ApiError(404, "volunteer_not_found", f"there is no volunteer “{key[:64]}” with a public profile")
    return volunteer_daily(user=user)


class StatsFileOut(Schema):
    name: str
    size: int
    url: str


class StatsDumpOut(Schema):
    day: str
    files: list[StatsFileOut]


@router.get("/stats", response=answers(list[StatsDumpOut]), summary="Daily statistics dumps (gzip JSON and CSV)")
def stats_list(request: HttpRequest):
    return [
        {"day": dump["day"], "files": [
            {**file, "url": _absolute(request, reverse("stats-file", args=[dump["day"], file["name"]]))} for file in dump["files"]
        ]}
        for dump in stats_dumps()
    ]


SERIES_MAX_POINTS = 2000


class SeriesQuery(Schema):
    since: datetime.datetime | None = Field(
        None, description="Readings at or after this ISO 8601 time (UTC when it names no zone)."
    )
    max_points: int = Field(
        500, ge=2, le=SERIES_MAX_POINTS,
        description="At most this many points; a longer series is averaged in equal time buckets.",
    )


    @field_validator("since", mode="before")
    @classmethod
    def _written_as_a_time(cls, since: object) -> object:
        # pydantic would also read "0.5" as Unix seconds; the schema promises an ISO 8601 date and time.
        if isinstance(since, str) and not re.match(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d", since):
            raise ValueError("write an ISO 8601 date and time, such as 2026-12-01T07:00:00Z")
        return since

    @field_validator("since")
    @classmethod
    def _in_utc(cls, since: datetime.datetime | None) -> datetime.datetime | None:
        if since is None:
            return None
        try:
            return since.astimezone(datetime.UTC) if since.tzinfo else since.replace(tzinfo=datetime.UTC)
        except OverflowError:
            raise ValueError("the time is outside the years 1 to 9999 in UTC") from None


class SeriesOut(Schema):
    run: str
    bucket_seconds: float | None = Field(description="Width of the time buckets, or null when the points are the raw readings.")
    at: list[float] = Field(description="Unix seconds of each point.")
    global_epoch: list[int]
    samples_per_second: list[float]
    alive_peers: list[float]
    client_peers: list[float]
    samples_accumulated: list[float]
    loss: list[float | None]


@router.get("/runs/{slug}/series", response=answers(SeriesOut, 400, 404), summary="A run's monitor series for its charts")
def run_series(request: HttpRequest, slug: Slug, query: Query[SeriesQuery]):
    """The coordinator monitor's readings of the swarm, as columns, downsampled to `max_points`."""
    run = Run.objects.filter(slug=slug).first()
    if run is None or not run_may_view(run=run, user=request.user):
        raise ApiError(404, "run_not_found", f"there is no run “{slug}” that you may see")
    return {"run": run.slug, **series_points(run=run, since=query.since, max_points=query.max_points)}


class EvaluationOut(Schema):
    epoch: int | None = Field(description="The checkpoint's epoch; null for a baseline.")
    baseline: bool = Field(description="A baseline, not a checkpoint: see kind.")
    kind: Literal["checkpoint", "random_init", "unigram", "bigram"] = Field(
        description="checkpoint; or a baseline: random_init, the model the run's peers started from, before any "
                    "training; unigram, each word's frequency in the run's training text (always guessing the "
                    "commonest); bigram, each word's frequency after the word to its left.")
    status: Literal["pending", "done", "failed"]
    samples: int = Field(description="Samples the collaboration had processed at the checkpoint.")
    tokens_seen: int = Field(description="Samples × the run's tokens per example.")
    mlm_accuracy: float | None = Field(description="Share of held-out masked tokens predicted right.")
    perplexity: float | None = Field(description="exp of the mean masked-LM loss per held-out masked token.")
    sop_accuracy: float | None = Field(description="Share of held-out sentence pairs whose order was told right; "
                                                   "null for the frequency baselines.")
    examples: int = Field(description="Held-out sentence pairs evaluated.")
    masked_tokens: int
    cpu_seconds: float
    wall_seconds: float
    error: str = Field(description="Why a failed evaluation failed.")
    created_at: str


@router.get("/runs/{slug}/evaluations", response=answers(list[EvaluationOut], 400, 404),
            summary="A run's held-out evaluations: the baselines first, then each checkpoint by epoch")
def run_evaluations(request: HttpRequest, slug: Slug):
    """Scores on the run's held-out split, which no agent trains on (docs/organizers.md)."""
    run = Run.objects.filter(slug=slug).first()
    if run is None or not run_may_view(run=run, user=request.user):
        raise ApiError(404, "run_not_found", f"there is no run “{slug}” that you may see")
    return [evaluation_row(evaluation) for evaluation in evaluations_of(run=run)]
