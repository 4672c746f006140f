"""``/healthz`` (the process answers) and ``/readyz`` (it can serve: its database, and Redis when
configured, answer), for load balancers, container health checks and uptime monitors.

They are answered by the first middleware, ahead of Django's host check, HTTPS redirect, sessions
and CSRF: a probe from inside a container comes without the public host name and over plain HTTP,
and a probe must stay cheap. They say nothing about runs or volunteers.
"""

from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse

REDIS_TIMEOUT_SECONDS = 2.0
RETRY_AFTER_SECONDS = 10


def readiness_problems() -> dict[str, str]:
    """What keeps this process from serving: ``{"database": "...", "redis": "..."}``, empty when ready."""
    problems = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        problems["database"] = f"the database does not answer: {_first_line(exc)}"
        connection.close_if_unusable_or_obsolete()
    if settings.REDIS_URL:
        import redis  # only where Redis is configured: the embedded defaults need no client for it

        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                          socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
            try:
                client.ping()
            finally:
                client.close()
        except redis.RedisError as exc:
            problems["redis"] = f"Redis does not answer: {_first_line(exc)}"
    return problems


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "alive"})


def readyz(request: HttpRequest) -> HttpResponse:
    problems = readiness_problems()
    if not problems:
        return JsonResponse({"status": "ready"})
    response = JsonResponse({"status": "unavailable", "problems": problems}, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


PROBES = {"/healthz": healthz, "/readyz": readyz}


class HealthProbeMiddleware:
    """Answers the probes before any other middleware runs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is not None and request.method in ("GET", "HEAD"):
            return probe(request)
        return self.get_response(request)
