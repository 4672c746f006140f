"""The portal's JSON API as the agent uses it: who am I, join a run, refresh access, download files,
time transfers to and from the portal's bandwidth probes.

Connection errors and 5xx answers are retried with exponential backoff and jitter; a 4xx answer
is the portal's decision and becomes :class:`PortalRefused` carrying its ``{"error": {"code",
"detail"}}``, whose ``detail`` is a sentence meant for the volunteer.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from peer_agent import __version__
from peer_agent.protocol import JoinRequest, JoinResponse, MachineCredit, RefreshResponse

logger = logging.getLogger(__name__)

PAUSE_CODES = frozenset({"run_paused", "run_not_active"})
"""The run is not training now but may resume: wait and join again."""

RETRY_LATER_CODES = frozenset({"coordinator_unavailable"})
"""The run is active but its swarm cannot be entered now (a 503 with ``Retry-After``): join again shortly."""

SESSION_OVER_CODES = frozenset({
    "session_ended", "run_finished", "banned", "token_revoked", "token_expired", "unauthorized", "forbidden",
    "invalid_token", "not_allowed", "invite_only", "session_suspended",
})
"""This agent may not go on training in this session (or at all) until a person acts."""


class PortalError(Exception):
    """The portal could not be used."""


class PortalUnavailable(PortalError):
    """The portal did not answer (or answered 5xx) even after retrying."""


class PortalRefused(PortalError):
    """The portal answered with a 4xx: ``code`` for programs, ``detail`` for people."""

    def __init__(self, code: str, detail: str, status: int, retry_after: float | None = None):
        super().__init__(detail)
        self.code, self.detail, self.status, self.retry_after = code, detail, status, retry_after

    @property
    def paused(self) -> bool:
        return self.code in PAUSE_CODES


@dataclass(frozen=True)
class StopReason:
    """Why training in the current session ends."""

    code: str
    detail: str

    @property
    def pause(self) -> bool:
        return self.code in PAUSE_CODES

    @property
    def rejoin(self) -> bool:
        """The run goes on: join again (once it is active) in a new session."""
        return self.code in PAUSE_CODES or self.code in RETRY_LATER_CODES or self.code == "session_ended"


@dataclass(frozen=True)
class Transfer:
    """Bytes moved to or from the portal and how long it took, from sending the request to the last byte."""

    size: int
    seconds: float


@dataclass(frozen=True)
class Download(Transfer):
    """A finished download of a file, and where it went."""

    path: Path


class PortalClient:
    """A synchronous client for one portal and one agent token; use it as a context manager.

    Open it in the process that uses it: hivemind calls the access refresher inside the DHT's
    forked process, where connections opened before the fork must not be reused.
    """

    def __init__(self, portal_url: str, token: str | None, *, timeout: float = 30.0, attempts: int = 5,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.portal_url = portal_url.rstrip("/")
        self.token = token
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)), transport=transport,
                                  headers={"User-Agent": f"peer-agent/{__version__}"}, follow_redirects=True)

    def __enter__(self) -> PortalClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def me(self) -> dict[str, Any]:
        """The token's owner: ``username``, ``public_name``, ``team``, ``token_name``, ``token_run``, ..."""
        return self._request("GET", "/api/v1/me", authorize=True).json()

    def run_summary(self, slug: str) -> dict[str, Any]:
        """A run's public summary, including its ``status`` and ``config``."""
        return self._request("GET", f"/api/v1/runs/{slug}/").json()

    def join(self, slug: str, request: JoinRequest) -> JoinResponse:
        """Open a training session in run ``slug`` for the peer key in ``request``."""
        response = self._request("POST", f"/api/v1/runs/{slug}/join", authorize=True,
                                 json=request.model_dump(mode="json"))
        return JoinResponse.model_validate_json(response.content)

    def refresh(self, session_id: int) -> dict[str, str]:
        """A fresh ``hivemind_access`` object for the session (the JSON hivemind's authorizer takes)."""
        response = self._request("POST", f"/api/v1/sessions/{session_id}/refresh", authorize=True)
        return RefreshResponse.model_validate_json(response.content).hivemind_access.model_dump(mode="json")

    def credit(self, session_id: int) -> MachineCredit:
        """What this machine (the session's agent token) earned in the session's run: confirmed, pending, lost."""
        response = self._request("GET", f"/api/v1/sessions/{session_id}/credit", authorize=True)
        return MachineCredit.model_validate_json(response.content)

    def download(self, url: str, dest: Path, *, authorize: bool = False,
                 progress: Callable[[int, int | None], None] | None = None) -> Download:
        """Stream ``url`` into ``dest`` (replaced only when complete). ``authorize`` sends the agent
        token, and only to the portal's own origin; signed data links need none. ``progress`` is told the
        bytes so far and the size, when the portal says it, after each chunk."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".part")
        headers = self._auth_headers(url) if authorize else {}
        for attempt in range(1, self.attempts + 1):
            started = time.perf_counter()
            try:
                with self._http.stream("GET", url, headers=headers) as response:
                    if response.status_code < 500:
                        if response.is_error:
                            response.read()
                            raise _refusal(response)
                        size, total = 0, response.headers.get("Content-Length")
                        total = int(total) if total and total.isdigit() else None
                        with open(partial, "wb") as file:
                            for chunk in response.iter_bytes(1 << 16):
                                file.write(chunk)
                                size += len(chunk)
                                if progress is not None:
                                    progress(size, total)
                        seconds = time.perf_counter() - started
                        partial.replace(dest)
                        return Download(size=size, seconds=seconds, path=dest)
                    problem = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            self._wait_before_retry(attempt, f"GET {_without_query(url)}", problem)
        raise PortalUnavailable(f"could not download {_without_query(url)} from the portal: {problem}")

    def probe_download(self, size: int) -> Transfer:
        """Time a download of ``size`` random bytes from the portal (counted as they came over the wire)."""
        response, seconds = self._timed_request("GET", "/api/v1/probe/download", authorize=True, params={"size": size})
        return Transfer(response.num_bytes_downloaded, seconds)

    def probe_upload(self, size: int) -> Transfer:
        """Time an upload of ``size`` random bytes to the portal, until it answered that it had them all."""
        body = os.urandom(size)
        _, seconds = self._timed_request("POST", "/api/v1/probe/upload", authorize=True, content=body,
                                         headers={"Content-Type": "application/octet-stream"})
        return Transfer(size, seconds)

    def _auth_headers(self, url: str) -> dict[str, str]:
        if self.token is None:
            raise PortalRefused("unauthorized", "no agent token given", 401)
        if _origin(url) != _origin(self.portal_url):
            raise ValueError(f"refusing to send the agent token to {_origin(url)}, which is not the portal")
        return {"Authorization": f"Bearer {self.token}"}

    def _request(self, method: str, path: str, *, authorize: bool = False, **kwargs: Any) -> httpx.Response:
        return self._timed_request(method, path, authorize=authorize, **kwargs)[0]

    def _timed_request(self, method: str, path: str, *, authorize: bool = False, headers: dict[str, str] | None = None,
                       **kwargs: Any) -> tuple[httpx.Response, float]:
        """The answer, read whole, and the seconds its (last) attempt took."""
        url = self.portal_url + path
        headers = {**(headers or {}), **(self._auth_headers(url) if authorize else {})}
        for attempt in range(1, self.attempts + 1):
            started = time.perf_counter()
            try:
                response = self._http.request(method, url, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.status_code < 400:
                    return response, time.perf_counter() - started
                refusal = _refusal(response)
                if response.status_code < 500 or refusal.code in RETRY_LATER_CODES:
                    raise refusal
                problem = f"HTTP {response.status_code}"
            self._wait_before_retry(attempt, f"{method} {path}", problem)
        raise PortalUnavailable(f"the portal at {self.portal_url} did not answer {method} {path}: {problem}")

    def _wait_before_retry(self, attempt: int, what: str, problem: str) -> None:
        if attempt >= self.attempts:
            return
        delay = backoff_delay(attempt, self.backoff_s, self.max_backoff_s)
        logger.warning("%s failed (%s); trying again in %.1f s", what, problem, delay)
        time.sleep(delay)


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with jitter: about ``base_s * 2**(attempt-1)``, between half and all of it, capped."""
    ceiling = min(max_s, base_s * 2 ** (attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


def _refusal(response: httpx.Response) -> PortalRefused:
    try:
        retry_after = float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        retry_after = None
    try:
        error = response.json()["error"]
        return PortalRefused(str(error["code"]), str(error["detail"]), response.status_code, retry_after)
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:200] or response.reason_phrase
        return PortalRefused(f"http_{response.status_code}", f"the portal answered {response.status_code}: {text}",
                             response.status_code)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _without_query(url: str) -> str:
    return url.split("?", 1)[0]


class AccessRefresher:
    """The ``fetch_token`` of :class:`~peer_agent.authorizer.PortalAuthorizer`: the join's token first,
    then a refresh from the portal on each call. It opens its own connection per call (hivemind calls it
    in the DHT's forked process) and tells ``refusals`` (a multiprocessing queue, or None) why the portal
    refused, so the training loop in the parent process can stop or pause."""

    def __init__(self, portal_url: str, token: str, session_id: int, first: dict[str, str], refusals: Any = None):
        self.portal_url, self.token, self.session_id = portal_url, token, session_id
        self._first: dict[str, str] | None = first
        self._refusals = refusals

    def __call__(self) -> dict[str, str]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            with PortalClient(self.portal_url, self.token, timeout=15.0, attempts=2) as portal:
                return portal.refresh(self.session_id)
        except PortalRefused as refused:
            if self._refusals is not None:
                self._refusals.put((refused.code, refused.detail))
            raise


class RunWatcher:
    """Polls the run's public status so that a pause or the end of the run stops training promptly."""

    def __init__(self, portal_url: str, slug: str, interval: float = 60.0):
        self.portal_url, self.slug, self.interval = portal_url, slug, interval
        self.reason: StopReason | None = None
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="run-watcher", daemon=True).start()

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        with PortalClient(self.portal_url, None, timeout=15.0, attempts=1) as portal:
            while not self._closed.wait(self.interval):
                try:
                    status = portal.run_summary(self.slug)["status"]
                except (PortalError, KeyError, TypeError, ValueError) as exc:
                    logger.debug("Could not read run %s's status: %s", self.slug, exc)
                    continue
                if status == "paused":
                    self.reason = StopReason("run_paused", f"run “{self.slug}” was paused by its organizer")
                elif status == "finished":
                    self.reason = StopReason("run_finished", f"run “{self.slug}” has finished; thank you for contributing")


class CreditWatcher:
    """Reads the machine's credit every ``interval`` seconds (the first time soon after joining), for the
    display: ``latest`` is None until a read succeeds. Credit is confirmed epochs after the work, when an
    epoch's checks pass, so a minute's delay shows nothing late."""

    def __init__(self, portal_url: str, token: str, session_id: int, interval: float = 60.0, first_after: float = 5.0):
        self.portal_url, self.token, self.session_id = portal_url, token, session_id
        self.interval, self.first_after = interval, first_after
        self.latest: MachineCredit | None = None
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="credit-watcher", daemon=True).start()

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        with PortalClient(self.portal_url, self.token, timeout=15.0, attempts=1) as portal:
            wait = self.first_after
            while not self._closed.wait(wait):
                wait = self.interval
                try:
                    self.latest = portal.credit(self.session_id)
                except (PortalError, ValueError) as exc:  # an older portal, or away: the display shows no credit
                    logger.debug("Could not read this machine's credit: %s", exc)
