"""``GET /metrics`` for Prometheus, and the timing of every other HTTP request.

``/metrics`` is answered by a middleware, like the health probes (portal/health.py): Prometheus
scrapes by the container's address, over plain HTTP, without the public host name. It tells how
much the run is training and who reports, so it is protected: a scraper presents
``METRICS_TOKEN`` as a bearer token, or comes from one of ``METRICS_ALLOWED_NETWORKS``. With
neither set it is refused to everyone.
"""

import hmac
import ipaddress
import os
import time
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from accounts.auth import request_ip
from portal.errors import error_response
from portal.metrics import HTTP_REQUEST_SECONDS, HTTP_REQUESTS
from runs.swarm.gauges import RunGauges

METRICS_PATH = "/metrics"
UNMATCHED_ROUTE = "unmatched"  # a 404 names no route; its path must not become a label


def metrics_registry() -> CollectorRegistry:
    """What one scrape reads: every process's counters, and the runs' figures from the database."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:  # one process (the demo, the tests): its own counters
        registry.register(REGISTRY)
    registry.register(RunGauges())
    return registry


def scrape_refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read the metrics, as the response to send; None when it may."""
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return None
    address = request_ip(request)
    if _allowed_address(address):
        return None
    if token:
        response = error_response(401, "not_authenticated", "send 'Authorization: Bearer <METRICS_TOKEN>'")
        response["WWW-Authenticate"] = "Bearer"
        return response
    if settings.METRICS_ALLOWED_NETWORKS:
        return error_response(403, "forbidden", f"{address} is not in METRICS_ALLOWED_NETWORKS")
    return error_response(403, "metrics_off", "the portal serves no metrics: set METRICS_TOKEN or METRICS_ALLOWED_NETWORKS")


def _allowed_address(address: str | None) -> bool:
    try:
        client = ipaddress.ip_address(address or "")
    except ValueError:  # no address (a Unix socket) or not an IP: never allowed by network
        return False
    return any(client in network for network in settings.METRICS_ALLOWED_NETWORKS)


def metrics(request: HttpRequest) -> HttpResponse:
    refusal = scrape_refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Answers ``/metrics``; counts and times every other request by its route pattern and status."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info == METRICS_PATH and request.method in ("GET", "HEAD"):
            return metrics(request)
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None else UNMATCHED_ROUTE
        HTTP_REQUESTS.labels(route=route, method=_method(request), status=str(response.status_code)).inc()
        HTTP_REQUEST_SECONDS.labels(route=route).observe(time.perf_counter() - started)
        return response


def _method(request: HttpRequest) -> str:
    # A client may send any method name; the label keeps the standard ones only.
    method = request.method or ""
    return method if method in {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} else "other"
