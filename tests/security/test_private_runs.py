"""Who may *see* a run is a setting apart from who may *join* it: a members-only run is invisible to
everyone but its organizers, staff and its members, on every page, API route, the live socket, the
charts' series, the health page, the runs list, profiles and the statistics dumps. An outsider and
an anonymous visitor get what they get for a run that does not exist."""

import gzip
import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from accounts.services import token_create
from peer_agent.protocol import RunConfig
from portal.asgi import application
from runs.credit import exports
from runs.credit.rollup import credit_rollup
from runs.models import Run, RunMembership
from runs.setup import services
from tests.factories import RunFactory, join_body, report, session_for

pytestmark = pytest.mark.django_db(transaction=True)

SLUG = "hidden-run"
PAGES = ["/runs/{slug}/", "/runs/{slug}/health/", "/runs/{slug}/join/",
         # Its organizers' pages: refused as for a missing run, not as a run one may not organize.
         "/runs/{slug}/edit/", "/runs/{slug}/participants/", "/runs/{slug}/probes/", "/runs/{slug}/flags/"]
API = ["/api/v1/runs/{slug}/", "/api/v1/runs/{slug}/leaderboard", "/api/v1/runs/{slug}/checkpoints",
       "/api/v1/runs/{slug}/series", "/api/v1/runs/{slug}/evaluations"]


@pytest.fixture
def hidden(organizer, volunteer, outsider, settings):
    """An invite-only run only its members may see; vik is a member who trained in it (confirmed)."""
    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 0
    run = RunFactory(slug=SLUG, visibility=Run.Visibility.INVITE, audience=Run.Audience.MEMBERS, organizers=[organizer])
    RunMembership.objects.create(run=run, user=volunteer)
    report(session_for(run, volunteer), 64)
    credit_rollup()
    return run


def client_for(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def live_connects(user) -> bool:
    cookie = []
    if user is not None:
        session = client_for(user).cookies[settings.SESSION_COOKIE_NAME].value
        cookie = [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode())]

    async def connect() -> bool:
        communicator = WebsocketCommunicator(application, f"/ws/runs/{SLUG}/live/",
                                             headers=[(b"origin", b"http://127.0.0.1"), *cookie])
        connected, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected

    return async_to_sync(connect)()


def _without_request_id(body: str) -> str:
    """The body less what differs on every answer: its request id, and the masked CSRF token of the
    language switcher on an HTML error page (templates/404.html)."""
    body = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', 'name="csrfmiddlewaretoken" value=""', body)
    return re.sub(r'"request_id": "[^"]*"', '"request_id": ""', body)


@pytest.mark.parametrize("persona", ["anonymous", "outsider"])
def test_an_outsider_finds_no_trace_of_a_members_only_run(hidden, persona, outsider, volunteer, tmp_path):
    user = outsider if persona == "outsider" else None
    client = client_for(user)
    for path in PAGES + API:
        response = client.get(path.format(slug=SLUG))
        missing = client.get(path.format(slug="no-such-run"))
        assert response.status_code == missing.status_code, path  # 404, or 302: the join page asks to log in
        # Every answer names its own request id (portal/logs.py): compare the rest.
        assert _without_request_id(response.content.decode().replace(SLUG, "no-such-run")) == \
            _without_request_id(missing.content.decode()), path
    assert SLUG not in client.get("/").content.decode()
    assert SLUG not in json.dumps(client.get("/api/v1/runs/").json())
    assert SLUG not in client.get(f"/volunteers/{volunteer.username}/").content.decode(), "not on a member's profile"
    assert not live_connects(user)
    exports.stats_dump()
    for dumped in (settings.MEDIA_ROOT / "stats").rglob("*.gz"):
        assert SLUG not in gzip.decompress(dumped.read_bytes()).decode(), dumped.name


def test_its_members_organizers_and_staff_see_it(hidden, organizer, volunteer, staff):
    for user in (organizer, volunteer, staff):
        client = client_for(user)
        for path in ["/runs/{slug}/", "/runs/{slug}/health/", "/api/v1/runs/{slug}/", "/api/v1/runs/{slug}/leaderboard"]:
            assert client.get(path.format(slug=SLUG)).status_code == 200, (user.username, path)
        assert live_connects(user)
    assert SLUG in client_for(volunteer).get(f"/volunteers/{volunteer.username}/").content.decode(), "on their own profile"


def test_an_invitee_with_the_invite_link_becomes_a_member_and_then_sees_it(hidden, outsider):
    client = client_for(outsider)
    assert client.get(f"/runs/{SLUG}/join/").status_code == 404
    assert client.get(f"/runs/{SLUG}/join/?code=wrong").status_code == 404
    page = client.get(f"/runs/{SLUG}/join/?code={hidden.join_code}")
    assert page.status_code == 200 and "Enter the join code" in page.content.decode()
    client.post(f"/runs/{SLUG}/join/", {"action": "code", "code": hidden.join_code})
    assert RunMembership.objects.filter(run=hidden, user=outsider).exists()
    assert client.get(f"/runs/{SLUG}/").status_code == 200


def test_an_agent_of_an_outsider_cannot_tell_the_run_exists_but_a_members_agent_joins(hidden, outsider, volunteer):
    for user, status in ((outsider, 404), (volunteer, 200)):
        _, secret = token_create(user=user, name="laptop")
        response = Client().post(f"/api/v1/runs/{SLUG}/join", json.dumps(join_body(SLUG)), content_type="application/json",
                                 HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert response.status_code == status, (user.username, response.content)


def test_an_organizer_makes_a_run_members_only(organizer):
    run = RunFactory(slug="open-run", organizers=[organizer])
    client = client_for(organizer)
    assert 'name="audience"' in client.get("/runs/open-run/edit/").content.decode(), "a setting of the run's form"
    assert Client().get("/runs/open-run/").status_code == 200
    services.run_update(run=run, actor=organizer, name=run.name, description="", visibility=run.visibility,
                        audience=Run.Audience.MEMBERS, config=RunConfig.model_validate(run.config))
    assert Client().get("/runs/open-run/").status_code == 404
    assert client.get("/runs/open-run/").status_code == 200


@pytest.mark.parametrize("status", [Run.Status.ACTIVE, Run.Status.PAUSED, Run.Status.FINISHED])
def test_the_address_of_a_members_only_run_anyone_may_join_opens_its_door_and_nothing_else(organizer, outsider, status):
    """Its join page is the invitation: a signed-in person with the address learns the run's name
    and how to join, paused or finished as it may be, and sees nothing more of it until they joined."""
    RunFactory(slug="door-run", name="Sylheti ALBERT", visibility=Run.Visibility.UNLISTED, audience=Run.Audience.MEMBERS,
               status=status, organizers=[organizer])
    client = client_for(outsider)
    door = client.get("/runs/door-run/join/")
    assert door.status_code == 200 and "Sylheti ALBERT" in door.content.decode()
    for path in [path for path in PAGES + API if not path.endswith("/join/")]:
        assert client.get(path.format(slug="door-run")).status_code == 404, path


@pytest.mark.parametrize("shut_out", ["banned", "not listed", "no code", "draft"])
def test_whoever_a_members_only_run_would_not_let_in_finds_no_door(organizer, volunteer, outsider, shut_out):
    visibility = {"not listed": Run.Visibility.ALLOWLIST, "no code": Run.Visibility.INVITE}.get(shut_out, Run.Visibility.UNLISTED)
    status = Run.Status.DRAFT if shut_out == "draft" else Run.Status.ACTIVE
    run = RunFactory(slug="door-run", visibility=visibility, audience=Run.Audience.MEMBERS, status=status, organizers=[organizer])
    run.allowlist.add(volunteer)
    if shut_out == "banned":
        services.run_ban(run=run, actor=organizer, user=outsider)
    client = client_for(outsider)
    door, missing = client.get("/runs/door-run/join/"), client.get("/runs/no-such-run/join/")
    assert door.status_code == missing.status_code == 404
    assert _without_request_id(door.content.decode().replace("door-run", "no-such-run")) == \
        _without_request_id(missing.content.decode())
