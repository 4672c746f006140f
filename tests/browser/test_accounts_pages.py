"""A newcomer in a real browser: signs up, creates the account from the mailed link, creates an agent
token, sees it once, revokes it."""

import re

import pytest
from playwright.sync_api import expect

from accounts.models import AgentToken
from tests.accounts.machines import amina_machines_make
from tests.browser.steps import PHONE, log_in, open_mailed_link, page_problems

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_newcomer_signs_up_and_manages_an_agent_token(page, screenshot):
    page.goto("/")
    screenshot(page, "home")
    page.get_by_role("link", name="Sign up").click()
    page.fill("#id_username", "amina")
    page.fill("#id_email", "amina@example.org")
    page.fill("#id_password1", "short")
    page.fill("#id_password2", "short")
    page.get_by_role("button", name="Create account").click()
    expect(page.locator("#password2-errors")).to_contain_text("too short")
    screenshot(page, "signup-errors")

    page.fill("#id_password1", "plum-orbit-kettle-93")
    page.fill("#id_password2", "plum-orbit-kettle-93")
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
    screenshot(page, "signup-sent")
    open_mailed_link(page)
    expect(page.get_by_text("amina@example.org")).to_be_visible()
    page.get_by_role("button", name="Create my account").click()
    expect(page.get_by_role("heading", name="Agent tokens")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("Welcome, amina!")
    expect(page.locator("#token-blocked")).to_have_count(0)

    page.fill("#id_name", "home desktop")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token-secret").inner_text()
    assert re.fullmatch(r"dlp_[A-Za-z0-9_-]{43}", secret)
    screenshot(page, "token-created")

    page.goto("/tokens/")
    expect(page.locator("#new-token-secret")).to_have_count(0)
    page.get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("status")).to_contain_text("was revoked")
    expect(page.locator("#token-table")).to_contain_text("revoked")
    assert AgentToken.objects.get(name="home desktop").revoked_at is not None


def test_a_team_is_founded_and_shows_its_history(page, volunteer, screenshot):
    log_in(page, volunteer.username)
    page.goto("/teams/new/")
    page.fill("#id_name", "Dhaka Compute")
    page.fill("#id_description", "<script>alert('x')</script> We train Bengali models.")
    page.get_by_role("button", name="Found team").click()
    expect(page.get_by_role("heading", name="Dhaka Compute")).to_be_visible()
    expect(page.locator(".lead")).to_contain_text("<script>alert('x')</script>")
    expect(page.locator("table")).to_contain_text("Founded")
    screenshot(page, "team")


def test_a_volunteer_reads_why_each_epoch_lost_samples_on_a_phone(browser, live_server, screenshot):
    """A newcomer's check at 360 px in Bengali: as table columns, each lost epoch's reason was a word wide and
    the page some 3,700 px tall. Each epoch is now a block of labelled lines, its reason the block's width."""
    amina_machines_make()
    context = browser.new_context(base_url=live_server.url, viewport=PHONE, is_mobile=True)
    page = context.new_page()
    log_in(page, "amina")
    page.select_option("#language", "bn")
    page.get_by_role("button", name="Change language").click()
    page.goto("/volunteers/amina/")
    expect(page.locator("html")).to_have_attribute("lang", "bn")
    rows = page.locator("#volunteer-lost tbody tr")
    expect(rows).to_have_count(5)
    table = page.locator("#volunteer-lost").bounding_box()
    for why in rows.locator("td:last-child").all():
        assert why.bounding_box()["width"] >= 0.9 * table["width"], (why.bounding_box(), table)
    expect(rows.first.locator("td").first).to_be_visible()
    assert page_problems(page, "volunteer") == []
    screenshot(page, "phone-volunteer-lost-epochs")
    context.close()
