"""The permission matrix of the websocket routes, for the personas of tests/security/conftest.py.

AGENT: `WS /ws/agent/` with each persona's agent token (anonymous sends none), plus vik's revoked
token and vik's token limited to another run. Each row names the session a report claims; the
cell is what the portal answers: "ack", the error frame's code, or `code/4401` when the token
itself is refused (an error frame, then the socket closed with 4401).

LIVE: `WS /ws/runs/{slug}/live/` with each persona's session cookie. The cell is "snapshot" (the
feed opened and pushed the board), 4404 (no such run for this viewer) or DENIED (a foreign
`Origin`: the handshake is refused before any run is looked up). `WS /ws/leaderboard/live/` (the board
across runs) is everyone's, as its page is; a choice of board it does not have is 4400.
`WS /ws/notifications/live/` (the bell's count) is for a signed-in person only: 4401 otherwise.

A websocket route with no row fails `test_every_websocket_route_has_a_row`.
"""

import collections
import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from portal.asgi import application
from portal.routing import websocket_urlpatterns
from runs.models import Run
from tests.agent_wire import report
from tests.security.matrix import PERSONAS, TOKEN_PERSONAS
from tests.security.world import World, world_run, world_session

pytestmark = pytest.mark.django_db(transaction=True)  # the consumers read the database from other threads

M, R, B = "token_missing/4401", "token_revoked/4401", "banned"
N = "session_not_found"  # someone else's session, or one outside the token's run
DENIED = "denied"

AGENT = [
    # the session a report claims      anon oscar vik    bruno olga otto stella revoked elsewhere
    ("{public_session}",               M,   N,    "ack", N,    N,   N,   N,     R,      N),
    ("{invite_session}",               M,   N,    "ack", N,    N,   N,   N,     R,      N),
    ("{elsewhere_session}",            M,   N,    "ack", N,    N,   N,   N,     R,      "ack"),
    ("{banned_session}",               M,   N,    N,     B,    N,   N,   N,     R,      N),
]

LIVE = [
    # path                              origin                 anon  oscar vik   bruno olga  otto  stella
    ("/ws/runs/{public}/live/",         "http://127.0.0.1",    "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot"),  # noqa: E501
    ("/ws/runs/{invite}/live/",         "http://127.0.0.1",    "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot"),  # noqa: E501
    ("/ws/runs/{unlisted}/live/",       "http://127.0.0.1",    "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot"),  # noqa: E501
    ("/ws/runs/{draft}/live/",          "http://127.0.0.1",    4404, 4404, 4404, 4404, "snapshot", 4404, "snapshot"),
    ("/ws/runs/no-such-run/live/",      "http://127.0.0.1",    4404, 4404, 4404, 4404, 4404, 4404, 4404),
    ("/ws/runs/{public}/live/",         "http://evil.example", DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED),
    ("/ws/runs/{draft}/live/",          "http://evil.example", DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED),
    ("/ws/leaderboard/live/",           "http://127.0.0.1",    "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot"),  # noqa: E501
    ("/ws/leaderboard/live/?by=robots", "http://127.0.0.1",    4400, 4400, 4400, 4400, 4400, 4400, 4400),
    ("/ws/leaderboard/live/",           "http://evil.example", DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED),
    ("/ws/notifications/live/",         "http://127.0.0.1",    4401, "snapshot", "snapshot", "snapshot", "snapshot", "snapshot", "snapshot"),  # noqa: E501
    ("/ws/notifications/live/",         "http://evil.example", DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED),
]


@pytest.fixture
def sockets_world(world: World) -> World:
    """The security world plus an unlisted run, a draft, vik's session in otto's run (where the
    `elsewhere` token may report) and bruno's session in the public run he is banned from."""
    public, other = Run.objects.get(slug=world.values["public"]), Run.objects.get(slug="other-run")
    draft = world_run("draft-run", "public", world.users["olga"])
    Run.objects.filter(pk=draft.pk).update(status=Run.Status.DRAFT)
    unlisted = world_run("quiet-run", "unlisted", world.users["olga"])
    world.values.update(
        draft=draft.slug, unlisted=unlisted.slug,
        elsewhere_session=world_session(other, world.users["vik"], None).pk,
        banned_session=world_session(public, world.users["bruno"], None).pk,
    )
    return world


async def _agent_outcome(secret: str | None, session_id: int) -> str:
    headers = [(b"authorization", f"Bearer {secret}".encode())] if secret else []
    communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected, "the agent socket accepts, then answers a refused token with an error frame"
    try:
        await communicator.send_to(text_data=json.dumps(report(session_id, 1)))
        answer = json.loads(await communicator.receive_from(timeout=10))
        if answer["type"] == "ack":
            return "ack"
        if answer["code"].startswith("token_"):
            closed = await communicator.receive_output(timeout=10)
            return f"{answer['code']}/{closed['code']}"
        return answer["code"]
    finally:
        await communicator.disconnect()


def _cookie(user) -> list:
    if user is None:
        return []
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode())]


async def _live_outcome(path: str, origin: str, cookie: list) -> str | int:
    communicator = WebsocketCommunicator(application, path, headers=[(b"origin", origin.encode()), *cookie])
    connected, code = await communicator.connect(timeout=10)
    try:
        if not connected:
            return code if code != 1000 else DENIED  # the origin check closes with no code of its own
        snapshot = json.loads(await communicator.receive_from(timeout=10))
        assert "leaderboard" in snapshot or set(snapshot) == {"unread"}
        return "snapshot"
    finally:
        await communicator.disconnect()


def _cases(table: list, personas: list[str], columns: int) -> list:
    return [pytest.param(*row[:columns], dict(zip(personas, row[columns:], strict=True)), id=" ".join(row[:columns]))
            for row in table]


@pytest.mark.parametrize(("template", "expected"), _cases(AGENT, TOKEN_PERSONAS, 1))
def test_agent_socket(sockets_world, template, expected):
    session_id = int(template.format(**sockets_world.values))
    outcomes = {persona: async_to_sync(_agent_outcome)(sockets_world.tokens.get(persona), session_id)
                for persona in TOKEN_PERSONAS}
    assert outcomes == expected


@pytest.mark.parametrize(("template", "origin", "expected"), _cases(LIVE, PERSONAS, 2))
def test_live_socket(sockets_world, template, origin, expected):
    path = template.format(**sockets_world.values)
    outcomes = {persona: async_to_sync(_live_outcome)(path, origin, _cookie(sockets_world.users[persona]))
                for persona in PERSONAS}
    assert outcomes == expected


def test_every_websocket_route_has_a_row():
    paths = ["ws/agent/", *(template.lstrip("/").split("?")[0].format_map(collections.defaultdict(lambda: "slug"))
                            for template, *_ in LIVE)]
    missing = [str(route.pattern) for route in websocket_urlpatterns if not any(route.pattern.match(path) for path in paths)]
    assert not missing, f"websocket routes with no row in the permission matrix: {missing}"
