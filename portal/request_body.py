"""Request bodies larger than the largest upload the portal takes are answered 413 before they are read.

Django's ASGI handler reads a request's whole body (into memory, then a temporary file) before any
middleware or view runs, so a view that refuses a 200 MiB upload has received all of it first. This
wraps the Django application instead: a declared ``Content-Length`` past
``settings.REQUEST_BODY_MAX_BYTES`` is answered at once, and a body sent without one (chunked) is
counted as it arrives and cut off at the limit. The proxy in front should refuse such bodies before
they reach the portal at all (docs/deploy.md, "The proxy").
"""

import json
import logging

from django.conf import settings
from django.utils.text import capfirst

logger = logging.getLogger(__name__)


class RequestBodyLimit:
    """ASGI middleware around the Django application (portal/asgi.py)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        limit = settings.REQUEST_BODY_MAX_BYTES
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(scope, send, limit=limit, size=f"{declared} bytes declared")
            return
        if declared is not None:  # the server hands the application no more than was declared
            await self.app(scope, receive, send)
            return
        received, cut_off = 0, False

        async def counted():
            nonlocal received, cut_off
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Django's handler stops reading at a disconnect and answers nothing: the 413 is ours.
                    cut_off = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)
        if cut_off:
            await _refuse(scope, send, limit=limit, size=f"over {limit} bytes sent without a Content-Length")


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


async def _refuse(scope, send, *, limit: int, size: str) -> None:
    client = (scope.get("client") or ("?",))[0]
    logger.warning("request body refused: %s for %s %s from %s", size, scope.get("method"), scope.get("path"), client)
    detail = (f"the request is larger than {limit // 2**20} MiB, the most the portal takes in one request; "
              "upload the text in smaller files")
    if scope.get("path", "").startswith("/api/"):  # the API's one error shape (portal/errors.py)
        error = {"code": "request_too_large", "detail": detail, "request_id": None}
        content_type, body = b"application/json", json.dumps({"error": error}).encode()
    else:
        content_type, body = b"text/plain; charset=utf-8", f"{capfirst(detail)}.\n".encode()
    # Connection: close, so that the server drops the rest of the body instead of reading it for a next request.
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
