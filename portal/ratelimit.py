"""Rate limits: a sliding window per (limit, key), counted in the Django cache.

The window is cut into `SLOTS` slots, each a counter; an attempt is weighed against every slot
that overlaps the last window, the oldest one whole. A fixed window aligned to the clock would let
twice the limit through across its boundary; here no span of one window ever holds more than the
limit, at the price of a window up to one slot longer for a key that used it all.

`cache.add` creates a slot's counter only if it is missing and `cache.incr` bumps it; both are
atomic on Redis and on locmem, so concurrent requests can never both read the same count (a
get-then-set would let a burst through). A refused attempt takes its count back, so that a client
that waits the `Retry-After` it was told gets in. Limits come from `settings.RATE_LIMITS`.
"""

import functools
import hashlib
import math
import time

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, BaseCache, caches
from django.http import HttpResponse, JsonResponse

from portal.errors import error_response

SLOTS = 10


class RateLimited(Exception):
    """Too many attempts; `retry_after` is the number of seconds until one more is allowed."""

    def __init__(self, name: str, retry_after: int) -> None:
        self.name, self.retry_after = name, retry_after
        self.detail = f"too many attempts; try again in {retry_after} s"
        super().__init__(self.detail)


@functools.cache
def counters() -> BaseCache:
    """The cache the counters live in, one for the process. `django.core.cache.cache` is one per thread and
    async context: each agent socket, which checks a limit as it connects (runs/ingest/consumers.py), kept a
    Redis connection of its own for its whole life, and 10,000 sockets reach Redis's default maxclients."""
    return caches.create_connection(DEFAULT_CACHE_ALIAS)


def _counter_key(name: str, key: str, slot: int) -> str:
    # Hashed: keys hold usernames and IPs, and cache keys must stay short and plain.
    digest = hashlib.sha256(f"{name}\0{key}".encode()).hexdigest()[:32]
    return f"ratelimit:{name}:{digest}:{slot}"


def _slots(name: str, key: str, now: float) -> tuple[int, float, list[str]]:
    """The limit's allowance, its slot length, and the keys of the slots overlapping the last
    window, oldest first (the last one is the current slot)."""
    count_allowed, window = settings.RATE_LIMITS[name]
    slot_seconds = window / SLOTS
    current = int(now // slot_seconds)
    return count_allowed, slot_seconds, [_counter_key(name, key, slot) for slot in range(current - SLOTS, current + 1)]


def _retry_after(counts: list[int], count_allowed: int, slot_seconds: float, now: float) -> int:
    """Seconds until enough old slots have left the window for one more attempt."""
    current = int(now // slot_seconds)
    remaining = sum(counts)
    for age, count in enumerate(counts):  # oldest first; slot `age` leaves once the window passes its end
        remaining -= count
        if remaining < count_allowed:
            leaves_at = (current - SLOTS + age + 1 + SLOTS) * slot_seconds
            return max(1, math.ceil(leaves_at - now))
    return max(1, math.ceil((current + 1 + SLOTS) * slot_seconds - now))


def rate_limit_hit(*, name: str, key: str) -> None:
    """Count one attempt under the limit `name` for `key`; raise RateLimited past the limit."""
    now = time.time()
    count_allowed, slot_seconds, keys = _slots(name, key, now)
    counter = keys[-1]
    timeout = math.ceil(slot_seconds * (SLOTS + 1)) + 1
    counters().add(counter, 0, timeout=timeout)
    try:
        count = counters().incr(counter)
    except ValueError:  # the counter expired between add and incr: this is the new slot's first
        counters().add(counter, 1, timeout=timeout)
        count = 1
    earlier = counters().get_many(keys[:-1])
    counts = [earlier.get(slot_key, 0) for slot_key in keys[:-1]] + [count]
    if sum(counts) > count_allowed:
        try:
            counters().decr(counter)
        except ValueError:  # expired meanwhile: nothing left to take back
            pass
        counts[-1] -= 1
        raise RateLimited(name, _retry_after(counts, count_allowed, slot_seconds, now))


def rate_limit_check(*, name: str, key: str) -> None:
    """Raise RateLimited if `key` has used up its allowance under `name` in the last window; count nothing.

    For limits on failures: the check comes before the attempt, `rate_limit_hit` after a failure.
    """
    now = time.time()
    count_allowed, slot_seconds, keys = _slots(name, key, now)
    found = counters().get_many(keys)
    counts = [found.get(slot_key, 0) for slot_key in keys]
    if sum(counts) >= count_allowed:
        raise RateLimited(name, _retry_after(counts, count_allowed, slot_seconds, now))


def rate_limited_response(exc: RateLimited) -> JsonResponse:
    """The API's 429: the usual error body and a `Retry-After` header."""
    response = error_response(429, "rate_limited", exc.detail)
    response["Retry-After"] = str(exc.retry_after)
    return response


def rate_limited_page(response: HttpResponse, exc: RateLimited) -> HttpResponse:
    """A page that shows the refusal as a form error, sent as a 429 with `Retry-After`."""
    response.status_code = 429
    response["Retry-After"] = str(exc.retry_after)
    return response
