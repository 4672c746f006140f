"""Every page at a phone's width (360 px), as a visitor, a volunteer reading Bengali and an organizer:
no page scrolls sideways, axe-core finds no serious or critical accessibility violation, and a
screenshot of each lands in artifacts/screenshots/phone-<role>-<page>.png. One browser session per
role visits every page, and the test reports every problem it met at once."""

import pytest
from django.contrib.auth.hashers import make_password
from django.utils import timezone
from playwright.sync_api import expect

from accounts.models import PendingSignUp
from accounts.notifications import notify
from accounts.services import team_create, token_digest
from runs.credit.rollup import credit_rollup
from runs.models import Certificate, RunSample
from tests.browser.steps import PHONE, log_in, page_problems
from tests.factories import NOW, PASSWORD, RunFactory, report, session_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CERTIFICATE = "bangla-amina-certificate"  # the code of amina's certificate for the run
SIGNUP_SECRET = "nadia-signup-link"  # the secret of the link mailed to a newcomer who signed up
PUBLIC_PAGES = {
    "home": "/", "runs": "/runs/", "run": "/runs/bangla/", "run-health": "/runs/bangla/health/",
    "leaderboard": "/leaderboard/", "leaderboard-teams": "/leaderboard/?by=team&window=all",
    "teams": "/teams/", "team": "/teams/dhaka-compute/", "volunteer": "/volunteers/amina/", "stats": "/stats/",
    "certificate": f"/certificates/{CERTIFICATE}/", "certificate-forged": "/certificates/forged0000000000000000/",
}
ROLE_PAGES = {
    "visitor": {**PUBLIC_PAGES, "login": "/accounts/login/", "signup": "/accounts/signup/",
                "signup-sent": "/accounts/signup/sent/", "signup-confirm": f"/accounts/signup/confirm/{SIGNUP_SECRET}/",
                "signup-failed": "/accounts/signup/confirm/not-a-link/", "password-reset": "/accounts/password_reset/"},
    "volunteer": {**PUBLIC_PAGES, "join": "/runs/bangla/join/", "tokens": "/tokens/", "profile": "/accounts/profile/",
                  "notifications": "/notifications/", "team-new": "/teams/new/", "password-change": "/accounts/password_change/"},
    "organizer": {"run": "/runs/bangla/", "run-new": "/runs/new/", "run-edit": "/runs/bangla/edit/",
                  "participants": "/runs/bangla/participants/", "flags": "/runs/bangla/flags/",
                  "run-health": "/runs/bangla/health/"},
}


@pytest.fixture
def bangla_run(organizer, volunteer):
    """An active run whose organizer is ``organizer``; ``volunteer`` (amina) trained in it and founded a team."""
    volunteer.username, volunteer.display_name = "amina", "Amina"
    volunteer.save()
    run = RunFactory(name="Bangla ALBERT", slug="bangla", description="ALBERT on Bengali news and Wikipedia.",
                     organizers=[organizer])
    report(session_for(run, volunteer, machine="home desktop"), samples=123456, at=NOW)
    credit_rollup()
    team_create(founder=volunteer, name="Dhaka Compute", description="We train Bengali models.")
    Certificate.objects.create(run=run, user=volunteer, code=CERTIFICATE)
    # The bell shows a count on every page of the volunteer's, and the notifications page has a row.
    notify(user=volunteer, kind="run_resumed", key="run-event:1", context={"run": run.name, "url": run.get_absolute_url()})
    now = timezone.now()
    for seconds, epoch in ((120, 3), (60, 4), (0, 5)):
        RunSample.objects.create(run=run, at=now - timezone.timedelta(seconds=seconds), global_epoch=epoch,
                                 samples_per_second=12.5, alive_peers=2, loss=6.25 - epoch / 10)
    return run


def visit_every_page(page, role: str, screenshot) -> list[str]:
    problems = []
    for name, path in ROLE_PAGES[role].items():
        page.goto(path)
        page.wait_for_load_state("load")
        problems += page_problems(page, f"{role} {path}")
        screenshot(page, f"phone-{role}-{name}")
    return problems


@pytest.fixture
def newcomer():
    """Someone who signed up and was mailed the link with SIGNUP_SECRET."""
    return PendingSignUp.objects.create(username="nadia", email="nadia@example.org", password=make_password(PASSWORD),
                                        token_digest=token_digest(SIGNUP_SECRET))


def test_every_page_fits_a_phone_and_passes_axe_for_every_role(browser, live_server, organizer, volunteer, bangla_run,
                                                                 newcomer, screenshot):
    problems = []
    for role, user in (("visitor", None), ("volunteer", volunteer), ("organizer", organizer)):
        context = browser.new_context(base_url=live_server.url, viewport=PHONE, is_mobile=True, has_touch=True,
                                      timezone_id="Asia/Dhaka")
        page = context.new_page()
        page.set_default_timeout(15_000)
        if user:
            log_in(page, user.username)
        if role == "volunteer":
            # The volunteer reads Bengali: chosen once in the footer, kept on every page after.
            page.select_option("#language", "bn")
            page.get_by_role("button", name="Change language").click()
            expect(page.locator("html")).to_have_attribute("lang", "bn")
        problems += visit_every_page(page, role, screenshot)
        context.close()
    assert not problems, "\n".join(problems)


def test_a_bengali_reader_sees_bengali_words_digits_and_local_times_on_the_live_board(browser, live_server, bangla_run,
                                                                                     screenshot):
    context = browser.new_context(base_url=live_server.url, viewport=PHONE, locale="bn-BD", timezone_id="Asia/Dhaka")
    page = context.new_page()
    page.goto("/runs/bangla/")
    expect(page.locator("html")).to_have_attribute("lang", "bn")
    expect(page.get_by_role("link", name="এই রানে যোগ দিন")).to_be_visible()
    row = page.locator("#leaderboard tbody tr").first
    expect(row).to_contain_text("১,২৩,৪৫৬")
    # 12:30 UTC is 18:30 in Dhaka: times.js rewrote the server's UTC time in the reader's zone and digits.
    expect(row.locator("time")).to_contain_text("৬:৩০")
    expect(page.locator("#chart-loss-latest")).to_contain_text("সর্বশেষ")
    # Each chart in words next to it, and in the plot's accessible name: its span, lowest and highest figure.
    expect(page.locator("#chart-loss-range")).to_contain_text("সর্বনিম্ন ৫.৭৫০, সর্বোচ্চ ৫.৯৫০")
    expect(page.locator("figure[data-field=loss] .chart-plot")).to_have_attribute(
        "aria-labelledby", "chart-loss-caption chart-loss-latest chart-loss-range")
    screenshot(page, "bengali-run-page")
    page.goto("/leaderboard/")
    expect(page.locator("#board time").first).to_contain_text("৬:৩০")
    screenshot(page, "bengali-leaderboard")
    context.close()
