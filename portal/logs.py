"""Log lines that an organizer can match to what a volunteer saw.

Every portal process (web, worker, beat, coordinator) logs through ``settings.LOGGING``: plain text,
or with ``LOG_FORMAT=json`` one JSON object a line with timestamp, level, logger and message, plus
the request id, run slug and training session id where the code knows them. The request id comes
from the client's (or the proxy's) ``X-Request-ID`` when it is a plain token, else it is drawn
fresh; it is returned in that header and in every API error body.
"""

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware
from pythonjsonlogger.json import JsonFormatter

REQUEST_ID_HEADER = "X-Request-ID"
# A proxy's id (nginx's $request_id is 32 hex digits) or a client's; anything else could forge log lines.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# Context variables follow a request into the thread that runs its view, and stay with one
# websocket connection's task.
_CONTEXT: dict[str, ContextVar] = {
    "request_id": ContextVar("request_id", default=None),
    "run": ContextVar("run", default=None),
    "session_id": ContextVar("session_id", default=None),
}


def request_id() -> str | None:
    """The id of the request being served, or None outside one."""
    return _CONTEXT["request_id"].get()


@contextmanager
def log_context(**values) -> Iterator[None]:
    """Stamp the log records made inside with ``request_id``, ``run`` or ``session_id``."""
    tokens = [(_CONTEXT[name], _CONTEXT[name].set(value)) for name, value in values.items()]
    try:
        yield
    finally:
        for variable, token in reversed(tokens):
            variable.reset(token)


class LogContext(logging.Filter):
    """Copies the context into each record, so that every formatter may name its fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, variable in _CONTEXT.items():
            if getattr(record, name, None) is None:
                setattr(record, name, variable.get())
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter(["levelname", "name", "message", *_CONTEXT], timestamp=True,
                         rename_fields={"levelname": "level", "name": "logger"})


def request_id_offered(offered: str) -> str:
    """The id a request is served under: the one it came with when that is a plain token, else a fresh one."""
    return offered if _REQUEST_ID.fullmatch(offered) else uuid.uuid4().hex


def _incoming_id(request: HttpRequest) -> str:
    return request_id_offered(request.headers.get(REQUEST_ID_HEADER, ""))


@sync_and_async_middleware
def request_id_middleware(get_response: Callable) -> Callable:
    """Gives each request its id, for its log lines, its error body and its response header."""
    if iscoroutinefunction(get_response):
        async def middleware(request: HttpRequest) -> HttpResponse:
            with log_context(request_id=_incoming_id(request)):
                response = await get_response(request)
                response[REQUEST_ID_HEADER] = request_id()
            return response
    else:
        def middleware(request: HttpRequest) -> HttpResponse:
            with log_context(request_id=_incoming_id(request)):
                response = get_response(request)
                response[REQUEST_ID_HEADER] = request_id()
            return response
    return middleware
