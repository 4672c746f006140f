"""The JSON API under /api/v1/, documented by the OpenAPI schema at /api/v1/openapi.json."""

import logging

from django.db import DatabaseError
from django.http import Http404, HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from accounts.api import router as accounts_router
from accounts.services import AgentTokenRefused
from portal.errors import ApiError, error_response
from portal.ratelimit import RateLimited, rate_limited_response
from runs.api.routes import router as runs_router

logger = logging.getLogger(__name__)

api = NinjaAPI(
    title="DeDLOC Portal API",
    version="1",
    description="Runs, agent credentials, contribution reports and leaderboards. "
    "Errors are `{\"error\": {\"code\", \"detail\", \"request_id\"}}` with a 4xx status (503 when the database "
    "is away); `request_id` is also the `X-Request-ID` header, the request's id in the portal's logs.",
    urls_namespace="api",
)


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError):
    response = error_response(exc.status, exc.code, exc.detail)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(AgentTokenRefused)
def _token_refused(request: HttpRequest, exc: AgentTokenRefused):
    logger.info("agent token refused (%s) from %s", exc.code, request.META.get("REMOTE_ADDR"))
    return error_response(exc.status, exc.code, exc.detail)


@api.exception_handler(RateLimited)
def _rate_limited(request: HttpRequest, exc: RateLimited):
    return rate_limited_response(exc)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError):
    return error_response(401, "token_missing", "send your agent token as 'Authorization: Bearer dlp_…'")


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError):
    fields = [{"loc": [str(part) for part in error.get("loc", ())], "msg": error.get("msg", "")} for error in exc.errors]
    first = fields[0] if fields else {"loc": [], "msg": "invalid request"}
    detail = f"{'.'.join(first['loc'][1:]) or 'request'}: {first['msg']}"
    return error_response(400, "invalid_request", detail, fields=fields)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError):
    return error_response(exc.status_code, "bad_request" if exc.status_code == 400 else "http_error", str(exc))


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404):
    return error_response(404, "not_found", str(exc) or "no such object")


@api.exception_handler(DatabaseError)
def _database_away(request: HttpRequest, exc: DatabaseError):
    # The database restarting or unreachable: no fault of the client's, which asks again later
    # (agents retry 5xx answers with backoff).
    logger.warning("API %s %s: database error", request.method, request.path, exc_info=exc)
    response = error_response(503, "unavailable", "the portal cannot reach its database now; try again shortly")
    response["Retry-After"] = "30"
    return response


api.add_router("/", accounts_router)
api.add_router("/", runs_router)
