"""Snapshots: the API's answers that every anonymous reader is given alike (a public run's board, the board
across runs, the run list), kept whole in Redis and sent again ahead of Django, for a crowd.

Django's ASGI handler spends about 0.8 ms of CPU on a request before the first middleware, and each of the
sync middlewares a hop to a thread (docs/benchmarks.md, "Boards for a crowd", measures both): a board read by
thousands a second cannot go through it every time. A view marks an answer anyone may be given with
``Cache-Control: public`` (runs/api/routes.py). This ASGI middleware (portal/asgi.py) keeps such an answer,
status, headers and body as Django's middleware made them, under the request's key and the boards' version it
was read at, and sends it again to every request with the same key while that version holds.

- **Which requests:** GETs under ``/api/v1/`` without a cookie or an ``Authorization`` header. A signed-in
  reader or an agent always reaches the views. The key holds the path, the query and the headers an answer
  may depend on (host, the proxy's scheme, the reader's languages), so a kept answer passed Django's host
  check, HTTPS redirect and headers for exactly those.
- **How fresh:** the version (``CreditRollup.boards_version``, runs/models/credit.py) moves in the transaction
  of every change a board or the run list shows, and every rollup pass; it is published here after the
  commit, and read before the views read the rows, so a snapshot is never older than its version. If two
  publications cross (two commits, their messages in the other order), the older version stands until the
  next, at most one rollup pass (``CREDIT_ROLLUP_EVERY_SECONDS``).
- **Only with Redis** (``REDIS_URL``): the embedded defaults' processes share no memory, so there every
  request reads the database, as it does whenever Redis does not answer.
"""

import asyncio
import functools
import json
import logging
import weakref

import redis
import redis.asyncio
from django.conf import settings

from portal.logs import REQUEST_ID_HEADER, request_id_offered
from portal.metrics import SNAPSHOTS

logger = logging.getLogger(__name__)

VERSION_KEY = "snapshots:version"
ANSWER_PREFIX = "snapshots:answer:"
# A backstop only: an answer stops being sent when the version moves (every rollup pass).
ANSWER_SECONDS = 120
PATH_PREFIX = "/api/v1/"
# Request headers an answer may vary on (ALLOWED_HOSTS, SECURE_PROXY_SSL_HEADER, the reader's languages).
KEY_HEADERS = (b"host", b"x-forwarded-proto", b"accept-language")
KEY_MAX = 2048  # a longer path or header is not worth keeping an answer for
REDIS_TIMEOUT_SECONDS = 0.5  # a Redis that stalls must not stall the answers: they are read afresh


def version_publish(version: int) -> None:
    """Tell the web processes the boards' version now committed (CreditRollup.boards_changed). A lost
    publication costs freshness, not correctness of the database: it is logged, never raised."""
    if not settings.REDIS_URL:
        return
    try:
        _client_sync(settings.REDIS_URL).set(VERSION_KEY, str(version))
    except redis.RedisError:
        logger.warning("snapshots: could not publish the boards' version", exc_info=True)


@functools.cache
def _client_sync(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS)


# Clients for each event loop: a client's connections belong to the loop that opened them.
_ASYNC_CLIENTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()


def _client_async() -> redis.asyncio.Redis:
    clients = _ASYNC_CLIENTS.setdefault(asyncio.get_running_loop(), {})
    url = settings.REDIS_URL
    if url not in clients:
        clients[url] = redis.asyncio.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                                    socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
    return clients[url]


def snapshot_key(scope) -> str | None:
    """The key of the answer to this request, or None when it is not one to keep or send from a snapshot."""
    if scope["type"] != "http" or scope["method"] != "GET" or not scope["path"].startswith(PATH_PREFIX):
        return None
    shown = {}
    for name, value in scope["headers"]:
        if name in (b"cookie", b"authorization"):
            return None
        if name in KEY_HEADERS:
            shown[name.decode()] = value.decode("latin-1")
    key = json.dumps([scope.get("scheme", "http"), scope["path"], scope["query_string"].decode("latin-1"), shown],
                     separators=(",", ":"))
    return ANSWER_PREFIX + key if len(key) <= KEY_MAX else None


class Snapshots:
    """ASGI middleware around the Django application (portal/asgi.py)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        key = snapshot_key(scope) if settings.REDIS_URL else None
        if key is None:
            await self.app(scope, receive, send)
            return
        try:
            version, kept = await _client_async().mget(VERSION_KEY, key)
        except redis.RedisError:
            logger.warning("snapshots: Redis does not answer; reading afresh", exc_info=True)
            await self.app(scope, receive, send)
            return
        if version is None:  # nothing published yet (a new Redis): the views read the database
            await self.app(scope, receive, send)
            return
        answer = _answer_read(kept, version)
        if answer is not None:
            SNAPSHOTS.labels(outcome="sent").inc()
            await _answer_send(answer, scope, send)
            return
        SNAPSHOTS.labels(outcome="read").inc()
        await self._read_and_keep(scope, receive, send, key, version)

    async def _read_and_keep(self, scope, receive, send, key: str, version: bytes) -> None:
        """Django answers; an answer it marked public is kept under the version read before it began."""
        start, body = None, []

        async def recording(message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, recording)
        if start is None or start["status"] != 200 or not _public(start["headers"]):
            return
        headers = [[name.decode("latin-1"), value.decode("latin-1")] for name, value in start["headers"]
                   if name.lower() != REQUEST_ID_HEADER.lower().encode()]
        kept = json.dumps({"version": version.decode(), "headers": headers}).encode() + b"\n" + b"".join(body)
        try:
            await _client_async().set(key, kept, ex=ANSWER_SECONDS)
        except redis.RedisError:
            logger.warning("snapshots: could not keep an answer", exc_info=True)


def _public(headers) -> bool:
    """Marked for everyone (``Cache-Control: public``), and setting no cookie, which would be one reader's."""
    names = {name.lower(): value for name, value in headers}
    return b"set-cookie" not in names and b"public" in names.get(b"cache-control", b"").lower().split(b", ")


def _answer_read(kept: bytes | None, version: bytes) -> tuple[list, bytes] | None:
    if kept is None:
        return None
    head, _, body = kept.partition(b"\n")
    meta = json.loads(head)
    if meta["version"] != version.decode():
        return None
    return meta["headers"], body


async def _answer_send(answer: tuple[list, bytes], scope, send) -> None:
    headers, body = answer
    offered = next((value.decode("latin-1") for name, value in scope["headers"]
                    if name == REQUEST_ID_HEADER.lower().encode()), "")
    sent = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    sent.append((REQUEST_ID_HEADER.encode(), request_id_offered(offered).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": sent})
    await send({"type": "http.response.body", "body": body})
