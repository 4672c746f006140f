"""A real Chromium (Debian's /usr/bin/chromium) driven by Playwright against a live portal."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.browser.steps import CSP_WATCH

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(os.environ.get("SCREENSHOT_DIR", Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class PolicyWatchedBrowser:
    """The browser, whose every new page records what the Content-Security-Policy refuses
    (tests/browser/steps.py, csp_violations)."""

    def __init__(self, browser: Browser) -> None:
        self._browser = browser

    def new_context(self, **options) -> BrowserContext:
        context = self._browser.new_context(**options)
        context.add_init_script(CSP_WATCH)
        return context

    def new_page(self, **options) -> Page:
        page = self._browser.new_page(**options)
        page.add_init_script(CSP_WATCH)
        return page

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between page actions are still plain synchronous calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            yield PolicyWatchedBrowser(browser)
            browser.close()
    finally:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def screenshot():
    """`screenshot(page, "name")` saves the page as artifacts/screenshots/name.png for reviewers."""

    def take(page, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    return take
