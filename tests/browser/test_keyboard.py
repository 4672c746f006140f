"""A volunteer who uses no mouse: signs up, creates an agent token and joins a run with Tab, typing
and Enter alone, every control reached in the page's focus order."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.steps import open_mailed_link
from tests.factories import RunFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FOCUSED = """() => {
  const element = document.activeElement;
  return { id: element.id, tag: element.tagName, text: (element.innerText || element.value || "").trim() };
}"""


def tab_to(page, *, id: str = "", text: str = "", limit: int = 40) -> None:
    """Press Tab until the element with ``id`` (or whose text is ``text``) has the focus (it may have
    it already: the sign-up form focuses its first field)."""
    seen = []
    for _ in range(limit + 1):
        focused = page.evaluate(FOCUSED)
        if (id and focused["id"] == id) or (text and focused["text"] == text):
            return
        seen.append(focused["id"] or focused["text"][:30])
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {id or text!r}; the focus went through {seen}")


def test_sign_up_create_a_token_and_join_a_run_with_the_keyboard_alone(page, screenshot):
    RunFactory(name="Bangla ALBERT", slug="bangla")
    page.goto("/")
    tab_to(page, text="Sign up")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Become a volunteer")).to_be_visible()
    for field, value in (("id_username", "rahim"), ("id_email", "rahim@example.org"),
                         ("id_password1", "plum-orbit-kettle-93"), ("id_password2", "plum-orbit-kettle-93")):
        tab_to(page, id=field, limit=3)  # the fields follow one another
        page.keyboard.type(value)
    tab_to(page, text="Create account", limit=3)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
    open_mailed_link(page)  # the link that creates the account, from the mail client
    tab_to(page, text="Create my account")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Agent tokens")).to_be_visible()

    tab_to(page, id="id_name")
    page.keyboard.type("home desktop")
    tab_to(page, text="Create token")
    page.keyboard.press("Enter")
    assert re.fullmatch(r"dlp_[A-Za-z0-9_-]{43}", page.locator("#new-token-secret").inner_text())

    page.locator("body").focus()
    tab_to(page, text="Runs")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/runs/$"))
    tab_to(page, id="run-search")
    page.keyboard.type("bangla")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"\?q=bangla$"))
    expect(page.locator("#run-cards .card")).to_have_count(1)
    tab_to(page, text=page.locator("#run-cards .card").inner_text().strip())
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/runs/bangla/$"))
    tab_to(page, text="Join this run")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Join “Bangla ALBERT”")).to_be_visible()
    tab_to(page, id="join-machine")
    page.keyboard.type("laptop")
    tab_to(page, text="Create a token for this run", limit=3)
    page.keyboard.press("Enter")
    expect(page.locator("#join-command")).to_contain_text("PEER_AGENT_TOKEN=dlp_")
    screenshot(page, "keyboard-join")
