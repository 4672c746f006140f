"""The live run page in a real browser: a report arrives, the coordinator's monitor confirms its epoch,
the rollup counts it (Celery beat runs it every 10 s in production; here the test runs it), the
leaderboard row changes without reload."""

import datetime

import pytest
from playwright.sync_api import expect

from accounts.services import token_create
from runs.credit.rollup import credit_rollup
from runs.models import TrainingSession
from tests.browser.steps import send_report
from tests.factories import RunFactory, epoch_confirm

pytestmark = [pytest.mark.browser]


def test_a_report_updates_the_leaderboard_without_a_reload(browser, asgi_server, volunteer, screenshot, settings):
    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 0
    run = RunFactory(slug="live-demo", name="Live demo")
    token, secret = token_create(user=volunteer, name="laptop")
    session = TrainingSession.objects.create(
        run=run, user=volunteer, token=token, peer_public_key="ssh-rsa AAAA", agent_version="0.1.0",
        access_expires_at=datetime.datetime.now(datetime.UTC),
    )
    page = browser.new_page(base_url=asgi_server)
    page.goto("/runs/live-demo/")
    expect(page.locator("#leaderboard")).to_contain_text("No contributions yet")
    expect(page.locator("#live")).to_have_class("connected")
    page.evaluate("window.__not_reloaded = true")

    # Spaced as an agent reporting every few seconds at 16 samples/s would send them.
    assert send_report(asgi_server, secret, session.pk, 1, 96, ago_s=6) == {"type": "ack", "seq": 1}
    assert credit_rollup() == 1
    expect(page.locator("#live-epoch")).to_have_text("4")
    expect(page.locator("#leaderboard")).to_contain_text("No contributions yet")  # reported, not confirmed yet
    epoch_confirm(session, 4, at=datetime.datetime.now(datetime.UTC))
    credit_rollup()
    row = page.locator("#leaderboard tr[data-name='vik']")
    expect(row).to_contain_text("96")
    assert send_report(asgi_server, secret, session.pk, 2, 32) == {"type": "ack", "seq": 2}
    epoch_confirm(session, 4, at=datetime.datetime.now(datetime.UTC))
    assert credit_rollup() == 1
    expect(row).to_contain_text("128")
    assert page.evaluate("window.__not_reloaded") is True
    screenshot(page, "live-leaderboard")
    page.close()


def test_the_board_across_runs_updates_without_a_reload_and_shows_a_milestone(browser, asgi_server, volunteer, screenshot,
                                                                             settings):
    from runs.credit.milestones import VOLUNTEER_THRESHOLDS
    from tests.factories import report, session_for

    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 0
    session = session_for(RunFactory(slug="global-live", name="Global live"), volunteer)
    page = browser.new_page(base_url=asgi_server)
    page.goto("/leaderboard/")
    expect(page.locator("#board")).to_contain_text("No contributions yet")
    expect(page.locator("#board-live")).to_have_class("connected")
    page.evaluate("window.__not_reloaded = true")

    milestone = VOLUNTEER_THRESHOLDS["samples"][0]
    report(session, milestone - 1, epoch=1)  # stored and confirmed by the monitor
    assert credit_rollup() == 1
    row = page.locator("#board tr[data-name='vik']")
    expect(row).to_be_visible()
    expect(row.locator(".milestone-samples")).to_have_count(0)
    report(session, 1, epoch=2)
    assert credit_rollup() == 1
    mark = row.locator(".milestone-samples")
    expect(mark).to_have_attribute("aria-label", f"Milestone: {milestone:,} confirmed samples")
    assert page.evaluate("window.__not_reloaded") is True
    screenshot(page, "live-leaderboard-all-runs")
    page.close()
