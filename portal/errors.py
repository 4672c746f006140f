"""The one error shape of the JSON API: {"error": {"code", "detail", "request_id"}} with a 4xx (or a 503).

``request_id`` is the id of the request in the portal's logs (and its ``X-Request-ID`` header), so
that an organizer can find the log lines of the error a volunteer reports.
"""

from django.http import JsonResponse
from ninja import Field, Schema

from portal.logs import request_id


class ApiError(Exception):
    """Raised by API code for a refusal a client should read; never becomes a 500."""

    def __init__(self, status: int, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.retry_after = status, code, detail, retry_after


def error_response(status: int, code: str, detail: str, **extra) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "detail": detail, "request_id": request_id(), **extra}}, status=status)


class FieldError(Schema):
    loc: list[str] = Field(description='Where the invalid value is, e.g. ["query", "window"].')
    msg: str


class ErrorBody(Schema):
    code: str = Field(description="What went wrong, for programs, e.g. `run_not_found` or `rate_limited`.")
    detail: str = Field(description="What went wrong and what to do about it, for people.")
    request_id: str | None = Field(description="The request's id in the portal's logs, also sent as `X-Request-ID`.")
    fields: list[FieldError] | None = Field(None, description="Each invalid value, for `invalid_request`.")


class ErrorOut(Schema):
    error: ErrorBody


def answers(ok, *refusals: int) -> dict:
    """A route's ``response=``: ``ok`` with 200, and the error shape with every status it may refuse
    with. 503 is always among them: any request may find the database away (portal/api.py)."""
    return {200: ok, **{status: ErrorOut for status in sorted({*refusals, 503})}}
