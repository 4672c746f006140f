"""Rate limits: a fixed-window counter per (limit, key) in the Django cache.

`cache.add` creates the window's counter only if it is missing and `cache.incr` bumps it; both
are atomic on Redis and on locmem, so concurrent requests can never both read the same count
(a get-then-set would let a burst through). Limits come from `settings.RATE_LIMITS`.
"""

import hashlib
import math
import time

from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse, JsonResponse

from portal.errors import error_response


class RateLimited(Exception):
    """Too many attempts; `retry_after` is the number of seconds until the window ends."""

    def __init__(self, name: str, retry_after: int) -> None:
        self.name, self.retry_after = name, retry_after
        self.detail = f"too many attempts; try again in {retry_after} s"
        super().__init__(self.detail)


def _counter_key(name: str, key: str, window_start: int) -> str:
    # Hashed: keys hold usernames and IPs, and cache keys must stay short and plain.
    digest = hashlib.sha256(f"{name}\0{key}".encode()).hexdigest()[:32]
    return f"ratelimit:{name}:{digest}:{window_start}"


def rate_limit_hit(*, name: str, key: str) -> None:
    """Count one attempt under the limit `name` for `key`; raise RateLimited past the limit."""
    count_allowed, window = settings.RATE_LIMITS[name]
    now = time.time()
    window_start = int(now // window) * window
    counter = _counter_key(name, key, window_start)
    cache.add(counter, 0, timeout=window + 1)
    try:
        count = cache.incr(counter)
    except ValueError:  # the counter expired between add and incr: this is the new window's first
        cache.add(counter, 1, timeout=window + 1)
        count = 1
    if count > count_allowed:
        raise RateLimited(name, max(1, math.ceil(window_start + window - now)))


def rate_limit_check(*, name: str, key: str) -> None:
    """Raise RateLimited if `key` has used up its allowance under `name` in this window; count nothing.

    For limits on failures: the check comes before the attempt, `rate_limit_hit` after a failure.
    """
    count_allowed, window = settings.RATE_LIMITS[name]
    now = time.time()
    window_start = int(now // window) * window
    if (cache.get(_counter_key(name, key, window_start)) or 0) >= count_allowed:
        raise RateLimited(name, max(1, math.ceil(window_start + window - now)))


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
