"""An organizer sets up a run in the browser; a volunteer gets a working join command."""

import base64
import re

import httpx
import pytest
from playwright.sync_api import expect

from runs.models import Run
from runs.setup.corpus import corpus_write
from tests.browser.steps import csp_violations, log_in
from tests.factories import RunFactory, join_body

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_organizer_creates_and_activates_a_run_and_a_volunteer_gets_a_join_command(
    browser, live_server, organizer, volunteer, tmp_path, screenshot, coordinator
):
    page = browser.new_page(base_url=live_server.url)
    log_in(page, organizer.username)
    page.get_by_role("link", name="New run").click()
    page.select_option("#preset", "tiny")
    page.get_by_role("button", name="Use preset").click()
    page.fill("#id_name", "Bengali ALBERT demo")
    page.fill("#id_slug", "bengali-demo")
    page.fill("#id_description", "A tiny ALBERT on Bengali and English text.")
    page.fill("#id_training__target_batch_size", "4")
    page.fill("#id_tokenizer__vocab_size", "600")
    page.get_by_role("button", name="Create draft run").click()
    expect(page.locator("#training__target_batch_size-errors")).to_contain_text("Must be at least one peer")
    screenshot(page, "run-form-error")
    page.fill("#id_training__target_batch_size", "64")
    page.get_by_role("button", name="Create draft run").click()
    expect(page.locator("#run-status")).to_have_text("Draft")

    corpus = corpus_write(tmp_path / "corpus.txt", n_lines=1500)
    page.set_input_files("input[aria-label='Text file']", str(corpus))
    page.get_by_role("button", name="Upload text file").click()
    expect(page.get_by_role("status")).to_contain_text("Uploaded corpus.txt")
    page.get_by_role("button", name=re.compile("Train a 600-token Unigram tokenizer")).click()
    # The form's answer first: a reload while its navigation is under way fails ("Not attached to an
    # active page", CI of stop 38). The task then runs in the worker; the reload shows it done.
    expect(page.get_by_role("status")).to_contain_text("Tokenizer training started")
    page.reload()
    expect(page.locator("#tokenizer-status")).to_have_text("Ready")
    page.fill("input[name=try]", "আমি বাংলায় গান গাই।")
    page.get_by_role("button", name="Tokenize", exact=True).click()
    expect(page.locator("#tokens-tried")).to_contain_text("▁")
    page.get_by_role("button", name="Activate").click()
    expect(page.locator("#run-status")).to_have_text("Active")
    screenshot(page, "run-page-organizer")
    page.close()

    page = browser.new_page(base_url=live_server.url)
    log_in(page, volunteer.username)
    page.goto("/runs/bengali-demo/")
    page.get_by_role("link", name="Join this run").click()
    page.fill("input[name=machine]", "home desktop")
    page.get_by_role("button", name="Create a token for this run").click()
    command = page.locator("#join-command").inner_text()
    screenshot(page, "run-join")
    match = re.fullmatch(rf"PEER_AGENT_TOKEN=(dlp_\S+) peer-agent join --portal {re.escape(live_server.url)} bengali-demo",
                         command)
    assert match, command
    toml = base64.b64decode(page.locator("#agent-toml").get_attribute("href").split(",", 1)[1]).decode()
    assert f'token = "{match.group(1)}"' in toml and 'run = "bengali-demo"' in toml

    # The command's token really joins the run the command names, once its coordinator serves it.
    coordinator.sync()
    joined = httpx.post(
        f"{live_server.url}/api/v1/runs/bengali-demo/join",
        headers={"Authorization": f"Bearer {match.group(1)}"},
        json=join_body("bengali-demo"),
        timeout=30,
    )
    assert joined.status_code == 200, joined.text
    assert joined.json()["run_id"] == Run.objects.get(slug="bengali-demo").hivemind_run_id
    page.close()


def test_finishing_a_run_asks_first_and_a_no_keeps_it_active(page, organizer):
    run = RunFactory(slug="asked", organizers=[organizer])
    log_in(page, organizer.username)
    page.goto(f"/runs/{run.slug}/")
    questions = []

    def answer(dialog, accept: bool) -> None:
        questions.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda dialog: answer(dialog, accept=False))
    page.get_by_role("button", name="Finish").click()
    expect(page.locator("#run-status")).to_have_text("Active")
    assert questions == ["Finish this run for good?"]
    run.refresh_from_db()
    assert run.status == Run.Status.ACTIVE

    page.once("dialog", lambda dialog: answer(dialog, accept=True))
    page.get_by_role("button", name="Finish").click()
    expect(page.locator("#run-status")).to_have_text("Finished")
    assert len(questions) == 2
    assert csp_violations(page) == []
