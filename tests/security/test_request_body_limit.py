"""A request body larger than the largest upload the portal takes is answered 413, with the reason,
before it is read; the limit leaves room for every legitimate upload; the proxy's documented limit
is the same."""

import re
import socket
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings as django_settings

from portal.asgi import application

MiB = 2**20
TWO_HUNDRED_MIB = 200 * MiB


def _scope(path: str, headers: list, method: str = "POST") -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"testserver"), *headers], "client": ("203.0.113.7", 50000),
            "server": ("testserver", 80)}


async def _answer(scope: dict, chunks: list[bytes]) -> tuple[dict, bytes, int]:
    """The response to a request whose body is `chunks`, and how many chunks were never read."""
    communicator = ApplicationCommunicator(application, scope)
    for index, chunk in enumerate(chunks):
        await communicator.send_input({"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1})
    start = await communicator.receive_output(timeout=10)
    body = await communicator.receive_output(timeout=10)
    unread = communicator.input_queue.qsize()
    await communicator.wait(timeout=10)
    return start, body["body"], unread


@pytest.mark.parametrize("path", ["/runs/code-run/data/", "/api/v1/probe/upload"])
def test_a_declared_200_mib_body_is_refused_before_a_byte_of_it_is_read(db, path):
    # No body is sent at all: a handler that waited for it would never answer.
    start, body, _ = async_to_sync(_answer)(
        _scope(path, [(b"content-type", b"multipart/form-data; boundary=x"),
                      (b"content-length", str(TWO_HUNDRED_MIB).encode())]), [])
    assert start["status"] == 413
    assert (b"connection", b"close") in start["headers"]
    limit = django_settings.REQUEST_BODY_MAX_BYTES // MiB
    assert f"larger than {limit} MiB, the most the portal takes in one request".encode() in body
    if path.startswith("/api/"):
        assert body.startswith(b'{"error": {"code": "request_too_large"')


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(db, settings):
    settings.REQUEST_BODY_MAX_BYTES = MiB
    chunks = [b"x" * (MiB // 4)] * 8  # 2 MiB
    start, body, unread = async_to_sync(_answer)(_scope("/runs/code-run/data/", [(b"transfer-encoding", b"chunked")]), chunks)
    assert start["status"] == 413 and b"larger than 1 MiB" in body
    assert unread == 3, "reading stopped at the first chunk past the limit"


def test_a_body_within_the_limit_reaches_the_portal(db):
    start, _, _ = async_to_sync(_answer)(_scope("/healthz", [(b"content-length", b"5")], method="GET"), [b"hello"])
    assert start["status"] == 200


def test_the_real_server_answers_413_while_the_client_is_still_sending(asgi_server):
    host, port = asgi_server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b"POST /runs/code-run/data/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: multipart/form-data; boundary=x\r\n"
                           + f"Content-Length: {TWO_HUNDRED_MIB}\r\n\r\n".encode() + b"x" * 65536)
        answer = b""
        while chunk := connection.recv(65536):  # the server closes the connection after its answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"the most the portal takes in one request" in answer


def test_every_upload_form_fits_under_the_limit():
    largest_file = max(django_settings.DATA_FILE_MAX_BYTES, django_settings.TOKENIZER_MAX_BYTES,
                       2 * django_settings.PROBE_MAX_FILE_BYTES)  # a probe posts its train and test parts together
    assert django_settings.REQUEST_BODY_MAX_BYTES >= largest_file + django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def test_the_proxys_documented_limit_is_the_portals():
    root = Path(django_settings.BASE_DIR)
    deploy = (root / "docs" / "deploy.md").read_text() + (root / "deploy" / "nginx" / "portal.conf").read_text()
    (nginx,) = set(re.findall(r"client_max_body_size (\d+)m;", deploy))
    (caddy,) = set(re.findall(r"max_size (\d+)MiB", deploy))
    assert int(nginx) * MiB == int(caddy) * MiB == django_settings.REQUEST_BODY_MAX_BYTES
