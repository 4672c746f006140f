"""Open agent sockets per agent token, counted across every web process (docs/deploy.md, "Several web
processes").

With ``REDIS_URL`` each socket holds a lease in Redis: a sorted set per token of socket ids, each
scored by the moment its lease runs out (the set itself goes when its last lease does). A socket is
admitted by one script that drops the token's lapsed leases, counts the rest and adds its own, so
that two processes admitting at once cannot both take the last place. The process that holds a
socket renews its lease every third of a lease and drops it when the socket closes; the leases of a
process killed without closing its sockets lapse within one lease. Redis's clock scores the leases,
so the web hosts' clocks need not agree.

Without Redis (the embedded defaults: one web process serves every agent) the count is this process's.
"""

import asyncio
import logging
import threading
import uuid
from collections import defaultdict
from typing import Protocol

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

REDIS_TIMEOUT_SECONDS = 2.0
# KEYS[1]: a token's leases. ARGV: the socket's id, the limit, the lease in ms. 1 when admitted.
ADMIT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIREAT', KEYS[1], redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
return 1
"""
# KEYS[1]: a token's leases. ARGV: the lease in ms, then the ids of the sockets this process holds.
RENEW = """
local time = redis.call('TIME')
local expires = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], expires, ARGV[i])
end
redis.call('PEXPIREAT', KEYS[1], redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
return 1
"""


def leases_key(token_id: int) -> str:
    return f"dedloc:agent-sockets:{token_id}"


class TokenSockets(Protocol):
    async def socket_admit(self, *, token_id: int, limit: int) -> str | None:
        """A new socket's id, or None when the token already has ``limit`` sockets open."""

    async def socket_release(self, *, token_id: int, socket_id: str) -> None:
        """The socket closed: it no longer counts."""


class SocketsInProcess:
    """The sockets this process holds, by token."""

    def __init__(self) -> None:
        self.held: dict[int, set[str]] = defaultdict(set)

    def admit(self, *, token_id: int, limit: int, socket_id: str | None = None) -> str | None:
        if len(self.held.get(token_id, ())) >= limit:
            return None
        socket_id = socket_id or uuid.uuid4().hex
        self.held[token_id].add(socket_id)
        return socket_id

    def release(self, *, token_id: int, socket_id: str) -> None:
        self.held[token_id].discard(socket_id)
        if not self.held[token_id]:
            del self.held[token_id]

    async def socket_admit(self, *, token_id: int, limit: int) -> str | None:
        return self.admit(token_id=token_id, limit=limit)

    async def socket_release(self, *, token_id: int, socket_id: str) -> None:
        self.release(token_id=token_id, socket_id=socket_id)


class SocketLeases:
    """The count of every web process, as leases in Redis. Redis is reached from threads: a connect and
    a close are rare next to reports, and a thread's client serves every event loop of the process (a
    test's, uvicorn's) and the renewal alike.

    While Redis is away, a socket is admitted against this process's own count, with a warning: the
    limit keeps one token from costing the processes thousands of connections, and each process still
    bounds that, while refusing everyone would stop every volunteer's reports for the portal's own
    fault. The renewal writes those sockets' leases once Redis answers again, so they count from then.
    """

    def __init__(self, *, url: str, lease_seconds: float) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                           socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
        self.lease_ms = int(lease_seconds * 1000)
        self.here = SocketsInProcess()
        self._admit, self._renew = self.client.register_script(ADMIT), self.client.register_script(RENEW)
        # Held while the renewal writes and while a socket's lease is dropped: a renewal that read the
        # socket as held must not write its lease back after it was dropped (it would count for a lease).
        self._lock = threading.Lock()
        self._renewal: threading.Thread | None = None
        self._redis_away = False
        self.stopped = threading.Event()

    async def socket_admit(self, *, token_id: int, limit: int) -> str | None:
        self._renewal_start()
        return await asyncio.to_thread(self.admit, token_id=token_id, limit=limit)

    async def socket_release(self, *, token_id: int, socket_id: str) -> None:
        await asyncio.to_thread(self.release, token_id=token_id, socket_id=socket_id)

    def admit(self, *, token_id: int, limit: int) -> str | None:
        socket_id = uuid.uuid4().hex
        try:
            admitted = self._admit(keys=[leases_key(token_id)], args=[socket_id, limit, self.lease_ms])
        except redis.RedisError as error:
            self._redis_failed(error)
            with self._lock:
                return self.here.admit(token_id=token_id, limit=limit, socket_id=socket_id)
        self._redis_answered()
        if not admitted:
            return None
        with self._lock:
            self.here.held[token_id].add(socket_id)
        return socket_id

    def release(self, *, token_id: int, socket_id: str) -> None:
        with self._lock:
            self.here.release(token_id=token_id, socket_id=socket_id)
            try:
                self.client.zrem(leases_key(token_id), socket_id)
            except redis.RedisError as error:  # its lease, no longer renewed, lapses on its own
                logger.info("agent sockets: could not drop a lease of token %s now (%s)", token_id, error)

    def renew(self) -> None:
        """Extend the leases of every socket this process holds by one lease from now."""
        with self._lock:
            held = {token_id: sorted(sockets) for token_id, sockets in self.here.held.items()}
            if not held:
                return
            try:
                with self.client.pipeline(transaction=False) as pipeline:
                    for token_id, sockets in held.items():
                        self._renew(keys=[leases_key(token_id)], args=[self.lease_ms, *sockets], client=pipeline)
                    pipeline.execute()
            except redis.RedisError as error:
                self._redis_failed(error)
                return
        self._redis_answered()

    def _redis_failed(self, error: redis.RedisError) -> None:
        if not self._redis_away:  # once per outage, not once per agent that connects meanwhile
            logger.warning("agent sockets: Redis does not answer (%s); each web process counts its own sockets "
                           "until it does", error)
        self._redis_away = True

    def _redis_answered(self) -> None:
        if self._redis_away:
            logger.warning("agent sockets: Redis answers again; the sockets are counted across processes")
        self._redis_away = False

    def _renewal_start(self) -> None:
        if self._renewal is None:
            self._renewal = threading.Thread(target=self._renew_until_stopped, name="agent-socket-leases", daemon=True)
            self._renewal.start()

    def _renew_until_stopped(self) -> None:
        # A third of a lease: two renewals can be late (a busy process) before a held socket's lease lapses.
        while not self.stopped.wait(self.lease_ms / 3000):
            self.renew()


def token_sockets_for_settings() -> TokenSockets:
    if settings.REDIS_URL:
        return SocketLeases(url=settings.REDIS_URL, lease_seconds=settings.AGENT_SOCKET_LEASE_SECONDS)
    return SocketsInProcess()
