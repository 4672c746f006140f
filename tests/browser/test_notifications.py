"""The bell, the notifications page, the sign-up and the unsubscribe links in a real Chromium:
the unread count follows what the volunteer reads and rings live when a notice is made, the e-mails' links work from a logged-out
browser, and axe-core finds no serious or critical violation on the pages they lead to."""

import re

import pytest
from playwright.sync_api import expect

from accounts.models import User
from accounts.notifications import notify
from tests.browser.steps import axe_findings, log_in, open_mailed_link, watch_console
from tests.factories import PASSWORD, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_bell_counts_unread_notifications_until_they_are_read(browser, asgi_server, screenshot):
    page = browser.new_page(base_url=asgi_server, viewport={"width": 1280, "height": 900})  # websockets too
    problems = watch_console(page)
    amina = UserFactory(username="amina")
    for key, run in (("run-event:1", "Bangla ALBERT"), ("run-event:2", "Hindi BERT")):
        notify(user=amina, kind="run_paused", key=key, context={"run": run, "url": "/runs/"})
    log_in(page, "amina")
    bell = page.locator("#bell")
    expect(bell).to_have_accessible_name("Notifications: 2 unread")
    expect(bell.locator(".bell-count")).to_have_text("2")

    bell.click()
    expect(page).to_have_url(re.compile(r"/notifications/$"))
    expect(page.locator("#notification-list li.unread")).to_have_count(2)
    assert axe_findings(page) == []
    screenshot(page, "notifications")

    page.locator("#notification-list li", has_text="Hindi BERT").get_by_role("button", name="Mark read").click()
    expect(bell).to_have_accessible_name("Notifications: 1 unread")
    expect(page.locator("#notification-list li.unread")).to_contain_text("Bangla ALBERT")
    page.get_by_role("button", name="Mark all read").click()
    expect(bell.locator(".bell-count")).to_have_count(0)
    expect(bell).to_have_accessible_name("Notifications")

    # A notice the worker makes while the page is open rings the bell, with no reload.
    page.evaluate("window.stillThisPage = true")
    notify(user=amina, kind="run_resumed", key="run-event:4", context={"run": "Bangla ALBERT", "url": "/runs/"})
    expect(bell).to_have_accessible_name("Notifications: 1 unread", timeout=15_000)
    expect(bell.locator(".bell-count")).to_have_text("1")
    # Drawn with the page's icon, redrawn by bell.js too: an emoji would be a box without an emoji font.
    expect(bell.locator("svg.bell-icon")).to_be_visible()
    assert "🔔" not in bell.inner_text()
    assert page.evaluate("window.stillThisPage === true")
    assert problems == []
    page.close()


def test_the_unsubscribe_link_of_an_email_works_in_a_logged_out_browser(page, live_server, screenshot):
    amina = UserFactory(username="amina")
    notify(user=amina, kind="run_finished", key="run-event:3", context={"run": "Bangla ALBERT"})
    open_mailed_link(page, "notifications/unsubscribe")
    expect(page.get_by_text("Stop e-mails about “A run I train for is finished”?")).to_be_visible()
    assert axe_findings(page) == []
    page.get_by_role("button", name="Unsubscribe").click()
    expect(page.locator("#unsubscribe-result")).to_contain_text("no more e-mails")
    screenshot(page, "unsubscribed")
    amina.refresh_from_db()
    assert amina.email_opt_outs == ["run_finished"]


def test_sign_up_by_the_mailed_link_then_create_a_token(page, live_server, screenshot):
    page.goto("/accounts/signup/")
    page.fill("#id_username", "rumana")
    page.fill("#id_email", "rumana@example.org")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
    assert axe_findings(page) == [] and not User.objects.filter(username="rumana").exists()
    screenshot(page, "signup-check-your-email")

    open_mailed_link(page)
    link = page.url
    expect(page.get_by_text("rumana@example.org")).to_be_visible()
    assert axe_findings(page) == []
    screenshot(page, "signup-confirm")
    page.get_by_role("button", name="Create my account").click()
    expect(page.get_by_text("Welcome, rumana!")).to_be_visible()
    page.fill("#id_name", "home desktop")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#new-token-secret")).to_contain_text("dlp_")
    assert User.objects.get(username="rumana").agent_tokens.count() == 1

    page.goto(link)  # opened again, the used link says why nothing happens and what to do
    expect(page.locator("#signup-failed")).to_contain_text("This link was used already")
    assert axe_findings(page) == []
