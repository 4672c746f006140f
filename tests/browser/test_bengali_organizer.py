"""An organizer who reads Bengali, on a phone: the organizer panel, the health page, the run form,
the participants and flagged-credit pages come in Bengali words and digits, fit 360 px without
scrolling sideways, and pass axe-core; screenshots land in artifacts/screenshots/bengali-organizer-*.png."""

import datetime

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from runs.models import Backbone, Checkpoint, Run, RunSample, SessionEpoch
from runs.setup.services import run_ban
from tests.browser.steps import PHONE, log_in, page_problems
from tests.factories import RunFactory, UserFactory, session_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAGES = {"run": "/runs/bangla/", "health": "/runs/bangla/health/", "edit": "/runs/bangla/edit/",
         "participants": "/runs/bangla/participants/", "flags": "/runs/bangla/flags/", "new": "/runs/new/"}


@pytest.fixture
def bangla(organizer):
    """An active allowlist run with a swarm's readings, a backbone peer, a volunteer who came and went,
    a flagged epoch, a checkpoint and a ban: every part of the organizer's pages has something to show."""
    now = timezone.now()
    run = RunFactory(name="Bangla ALBERT", slug="bangla", organizers=[organizer], visibility=Run.Visibility.ALLOWLIST,
                     coordinator_peer_id="QmBackbonePeer", coordinator_heartbeat_at=now,
                     duties_until=now + datetime.timedelta(minutes=1))
    Backbone.objects.create(run=run, peer_id="QmBackbonePeer", host="backbone.example", maddrs=["/ip4/10.0.0.1/tcp/31337"],
                            heartbeat_at=now)
    RunSample.objects.bulk_create(
        RunSample(run=run, at=now - datetime.timedelta(minutes=30 - i), global_epoch=10 + i // 10,
                  samples_per_second=1234.5, alive_peers=3, client_peers=1, loss=4.0 - i / 100) for i in range(31))
    session = session_for(run, UserFactory(username="amina"))
    session.started_at, session.ended_at = now - datetime.timedelta(minutes=20), now - datetime.timedelta(minutes=2)
    session.save()
    SessionEpoch.objects.create(session=session, epoch=11, reported_samples=6400, announced_samples=640,
                                status=SessionEpoch.Status.FLAGGED, detail="6400 ≠ 640")
    Checkpoint.objects.create(run=run, epoch=12, file="checkpoints/x.zip", created_at=now - datetime.timedelta(minutes=9))
    run_ban(run=run, actor=organizer, user=UserFactory(username="mallory"), reason="")
    return run


def test_a_bengali_organizer_on_a_phone_gets_every_organizer_page_in_bengali(browser, live_server, organizer, bangla,
                                                                             screenshot):
    context = browser.new_context(base_url=live_server.url, viewport=PHONE, is_mobile=True, has_touch=True,
                                  timezone_id="Asia/Dhaka")
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, organizer.username)
    page.select_option("#language", "bn")
    page.get_by_role("button", name="Change language").click()
    expect(page.locator("html")).to_have_attribute("lang", "bn")

    page.goto(PAGES["run"])
    panel = page.locator("section.organizer")
    expect(panel.get_by_role("heading", name="আয়োজক")).to_be_visible()
    expect(panel.get_by_role("button", name="বিরতি দিন")).to_be_visible()
    expect(panel.get_by_role("textbox", name="অনুমোদিত তালিকা")).to_be_visible()
    # The audit log's times in the reader's zone and digits: times.js rewrote the server's UTC.
    expect(panel.locator("time").first).not_to_contain_text("UTC")
    expect(panel.locator("time").first).to_contain_text("২০")

    page.goto(PAGES["health"])
    expect(page.get_by_role("heading", name="কোঅর্ডিনেটর")).to_be_visible()
    expect(page.locator("#health-rate")).to_have_text("১,২৩৪.৫")
    expect(page.locator("#timeline")).to_contain_text("একটি পিয়ার যোগ দিয়েছে")
    expect(page.locator("#timeline")).to_contain_text("ইপক ১২-এর চেকপয়েন্ট")
    expect(page.locator("#backbones")).to_contain_text("সক্রিয়, দায়িত্বে আছে")
    # The charts' words, as charts.js rewrites them, in the same digits and grouping as the server's.
    expect(page.locator("#chart-samples_per_second-latest")).to_contain_text("১,২৩৪.৫ নমুনা/সে.")
    expect(page.locator("#chart-samples_per_second-range")).to_contain_text("সর্বনিম্ন ১,২৩৪.৫")

    problems = []
    for name, path in PAGES.items():
        page.goto(path)
        page.wait_for_load_state("load")
        expect(page.locator("html")).to_have_attribute("lang", "bn")
        problems += page_problems(page, path)
        screenshot(page, f"bengali-organizer-{name}")
    context.close()
    assert not problems, "\n".join(problems)
