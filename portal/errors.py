"""The one error shape of the JSON API: {"error": {"code": "...", "detail": "..."}} with a 4xx."""

from django.http import JsonResponse


class ApiError(Exception):
    """Raised by API code for a refusal a client should read; never becomes a 500."""

    def __init__(self, status: int, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.retry_after = status, code, detail, retry_after


def error_response(status: int, code: str, detail: str, **extra) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "detail": detail, **extra}}, status=status)
