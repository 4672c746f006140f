"""An open live socket shows only what its viewer may see now, not only what they could see when it
connected: a member who is banned or dropped from a members-only run's list, or who signs out, loses
its feed within seconds (closed with 4404, as for a run that does not exist), and the bell of a
volunteer who signed out or was deactivated stops (4401). Checked with Channels' communicator
against the real router, as a browser's socket would be."""

import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client
from django.utils import timezone

from accounts.live import NotificationsLiveConsumer
from accounts.models import Notification, User
from accounts.notifications import notify
from portal import live
from portal.asgi import application
from runs.credit.live import RunLiveConsumer
from runs.models import Run, RunMembership, RunSample
from runs.setup import services
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the consumers read the database from other threads

CLOSED_AS_MISSING = {"type": "websocket.close", "code": 4404}
SIGNED_OUT = {"type": "websocket.close", "code": 4401}


@pytest.fixture
def runs(organizer, volunteer) -> dict[str, Run]:
    """vik may see two members-only runs of olga's: on the allowlist of one, an invitee of the other;
    anyone may see the third."""
    listed = RunFactory(slug="listed-run", visibility=Run.Visibility.ALLOWLIST, audience=Run.Audience.MEMBERS,
                        organizers=[organizer])
    listed.allowlist.add(volunteer)
    invited = RunFactory(slug="invited-run", visibility=Run.Visibility.INVITE, audience=Run.Audience.MEMBERS,
                         organizers=[organizer])
    RunMembership.objects.create(run=invited, user=volunteer)
    return {"listed": listed, "invited": invited, "open": RunFactory(slug="open-run", organizers=[organizer])}


@pytest.fixture
def asked_every_frame(monkeypatch):
    """Every frame asks again whether its viewer may watch (the shipped feeds ask every few seconds;
    test_a_ban_closes_the_feed_with_the_shipped_recheck_interval plays them)."""
    monkeypatch.setattr(live.PushingConsumer, "recheck", 0.0)
    monkeypatch.setattr(RunLiveConsumer, "interval", 0.05)
    monkeypatch.setattr(NotificationsLiveConsumer, "interval", 0.05)


def signed_in(user: User) -> tuple[Client, list]:
    """A browser signed in as ``user``, and the headers its websockets send."""
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return client, [(b"origin", b"http://127.0.0.1"), (b"cookie", cookie.encode())]


def reading(run: Run) -> None:
    """A monitor reading unlike the run's earlier ones: the feed's next snapshot shows its pace."""
    earlier = RunSample.objects.filter(run=run).count()
    RunSample.objects.create(run=run, at=timezone.now(), global_epoch=7 + earlier, samples_per_second=100.0 + earlier,
                             alive_peers=5, loss=2.5)


def notice(user: User) -> None:
    with transaction.atomic():
        notify(user=user, kind=Notification.Kind.MILESTONE, key="later", context={"milestone": "1,000 samples", "url": "/"})


def closed(output: dict) -> bool:
    return output["type"] == "websocket.close"


def heard_after(path: str, headers: list, revoke, news, *, within: float = 60.0,
                until=closed) -> tuple[list[dict], float]:
    """Open the feed and take its first frame; then ``revoke`` the viewer's right to it, write
    ``news`` the feed would push, and return everything the feed sends until an output it sends
    is ``until`` (by default: it closes) or ``within`` seconds pass, with the seconds from the
    revocation to then. ``within`` is a deadline for a loaded machine, not a speed figure."""

    async def scenario() -> tuple[list[dict], float]:
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        assert connected, "the viewer may watch when the feed opens"
        try:
            await communicator.receive_from(timeout=10)
            await database_sync_to_async(revoke)()
            revoked = time.monotonic()
            await database_sync_to_async(news)()
            heard = []
            while time.monotonic() - revoked < within:
                # receive_nothing waits without ending the application, as receive_output's timeout would.
                if await communicator.receive_nothing(timeout=0.1):
                    continue
                heard.append(await communicator.receive_output())
                if until(heard[-1]) or closed(heard[-1]):
                    break
            return heard, time.monotonic() - revoked
        finally:
            await communicator.disconnect()

    return async_to_sync(scenario)()


def _ban(runs, organizer, volunteer, client) -> None:
    services.run_ban(run=runs["listed"], actor=organizer, user=volunteer, reason="spam")


def _allowlist_drop(runs, organizer, volunteer, client) -> None:
    services.run_allowlist_set(run=runs["listed"], actor=organizer, usernames=[])


def _invite_drop(runs, organizer, volunteer, client) -> None:
    RunMembership.objects.filter(run=runs["invited"], user=volunteer).delete()


def _sign_out(runs, organizer, volunteer, client) -> None:
    client.logout()


@pytest.mark.parametrize(("run", "revoke"), [
    pytest.param("listed", _ban, id="banned"),
    pytest.param("listed", _allowlist_drop, id="dropped from the allowlist"),
    pytest.param("invited", _invite_drop, id="dropped from the invite list"),
    pytest.param("listed", _sign_out, id="signed out"),
])
def test_a_member_who_may_no_longer_see_the_run_gets_no_further_frame(runs, organizer, volunteer, asked_every_frame,
                                                                      run, revoke):
    client, headers = signed_in(volunteer)
    heard, _ = heard_after(f"/ws/runs/{runs[run].slug}/live/", headers,
                           lambda: revoke(runs, organizer, volunteer, client), lambda: reading(runs[run]))
    assert heard == [CLOSED_AS_MISSING], "no frame after the revocation, not even the reading written after it"


def test_a_run_made_members_only_closes_an_outsiders_feed(runs, outsider, asked_every_frame):
    _, headers = signed_in(outsider)
    open_run = runs["open"]
    heard, _ = heard_after("/ws/runs/open-run/live/", headers,
                           lambda: Run.objects.filter(pk=open_run.pk).update(audience=Run.Audience.MEMBERS),
                           lambda: reading(open_run))
    assert heard == [CLOSED_AS_MISSING]


def test_the_organizer_and_a_remaining_member_keep_the_feed(runs, organizer, volunteer, outsider, asked_every_frame):
    listed = runs["listed"]
    for user in (organizer, volunteer):
        _, headers = signed_in(user)
        pace = 100.0 + RunSample.objects.filter(run=listed).count()  # what the reading written after the ban shows

        def shows_the_reading(output: dict, pace: float = pace) -> bool:
            return output["type"] == "websocket.send" and json.loads(output["text"])["samples_per_second"] == pace

        heard, _ = heard_after("/ws/runs/listed-run/live/", headers,
                               lambda: services.run_ban(run=listed, actor=organizer, user=outsider),
                               lambda: reading(listed), until=shows_the_reading)
        assert heard and {output["type"] for output in heard} == {"websocket.send"}, (user.username, heard)
        assert shows_the_reading(heard[-1]), "the reading written after the ban reached the feed"


@pytest.mark.parametrize("revoke", [
    pytest.param(lambda client, user: client.logout(), id="signed out"),
    pytest.param(lambda client, user: User.objects.filter(pk=user.pk).update(is_active=False), id="deactivated"),
])
def test_the_bell_stops_counting_for_a_volunteer_no_longer_signed_in(volunteer, asked_every_frame, revoke):
    client, headers = signed_in(volunteer)
    heard, _ = heard_after("/ws/notifications/live/", headers, lambda: revoke(client, volunteer),
                           lambda: notice(volunteer))
    assert heard == [SIGNED_OUT], "no count after they signed out, not even of the notice made after it"


def test_a_ban_closes_the_feed_with_the_shipped_recheck_interval(runs, organizer, volunteer):
    # Behaviour only: the wait is a generous deadline, not a speed figure (a loaded machine is slow).
    _, headers = signed_in(volunteer)
    listed = runs["listed"]
    heard, _seconds = heard_after("/ws/runs/listed-run/live/", headers,
                                  lambda: services.run_ban(run=listed, actor=organizer, user=volunteer),
                                  lambda: reading(listed), within=live.VIEWER_RECHECK_SECONDS * 12)
    assert heard[-1:] == [CLOSED_AS_MISSING], heard
