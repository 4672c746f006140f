"""The whole product as its users meet it, in one story: an organizer sets up a run in the browser,
a volunteer signs up and runs the join command the page shows, the live leaderboard fills without a
reload, the organizer pauses and resumes the run and the agents follow, and downloads the checkpoint
the coordinator saved."""

import os
import re
import signal
import time
import zipfile
from pathlib import Path

import pytest
from django.db.models import Max, Min
from playwright.sync_api import expect

from accounts.models import User
from accounts.services import token_create
from harness.processes import children_reap
from runs.models import Checkpoint, ContributionEvent, Run, RunCredit, TrainingSession
from runs.setup.corpus import corpus_write
from tests.browser.steps import csp_violations, log_in, open_mailed_link
from tests.e2e.agents import agent, serve_until, wait_for
from tests.factories import PASSWORD, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.swarm, pytest.mark.timeout(900)]

SLUG = "story"


def organizer_creates_a_run(page, corpus) -> None:
    page.get_by_role("link", name="New run").click()
    page.select_option("#preset", "tiny")
    page.get_by_role("button", name="Use preset").click()
    page.fill("#id_name", "Story run")
    page.fill("#id_slug", SLUG)
    page.fill("#id_description", "A tiny ALBERT, set up in the browser.")
    # Small enough for two agents on two cores: an epoch every few seconds.
    for field, value in {"data__max_seq_length": "64", "tokenizer__vocab_size": "800",
                         "training__target_batch_size": "32", "training__per_device_batch_size": "8",
                         "averaging__matchmaking_time": "1.5", "averaging__averaging_timeout": "15",
                         "averaging__checkpoint_every_epochs": "2"}.items():
        page.fill(f"#id_{field}", value)
    page.get_by_role("button", name="Create draft run").click()
    expect(page.locator("#run-status")).to_have_text("Draft")
    page.set_input_files("input[aria-label='Text file']", str(corpus))
    page.get_by_role("button", name="Upload text file").click()
    expect(page.get_by_role("status")).to_contain_text("Uploaded corpus.txt")
    page.get_by_role("button", name=re.compile("Train a 800-token Unigram tokenizer")).click()
    # The form's answer first: a reload while its navigation is under way fails ("Not attached to an
    # active page", seen in a CI rehearsal). The task then runs in the worker; the reload shows it done.
    expect(page.get_by_role("status")).to_contain_text("Tokenizer training started")
    page.reload()
    expect(page.locator("#tokenizer-status")).to_have_text("Ready")
    page.get_by_role("button", name="Activate").click()
    expect(page.locator("#run-status")).to_have_text("Active")


def volunteer_signs_up_and_gets_the_join_command(page, server: str) -> tuple[str, str]:
    page.goto("/accounts/signup/")
    page.fill("#id_username", "rumana")
    page.fill("#id_email", "rumana@example.org")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
    open_mailed_link(page)  # the account is made from the mailed link
    page.get_by_role("button", name="Create my account").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    page.goto(f"/runs/{SLUG}/")
    page.get_by_role("link", name="Join this run").click()
    page.fill("input[name=machine]", "laptop")
    page.get_by_role("button", name="Create a token for this run").click()
    command = page.locator("#join-command").inner_text()
    match = re.fullmatch(rf"PEER_AGENT_TOKEN=(dlp_\S+) peer-agent join --portal ({re.escape(server)}) ({SLUG})", command)
    assert match, command
    return match.group(1), match.group(3)


def organizer_returns(browser, server: str, organizer):
    """The organizer comes back to the run page in a new browser session.

    (A page left open for minutes while agents trained sometimes had its requests stall in
    Chromium for a minute; a fresh session does not depend on that.)"""
    page = browser.new_page(base_url=server)
    log_in(page, organizer.username)
    page.goto(f"/runs/{SLUG}/")
    return page


def reports_of(username: str) -> int:
    return ContributionEvent.objects.filter(session__user__username=username).count()


def epoch_reached(username: str) -> int:
    """The newest collaboration epoch the volunteer's agent reported training in."""
    return ContributionEvent.objects.filter(session__user__username=username).aggregate(epoch=Max("local_epoch"))["epoch"]


def test_a_run_from_setup_to_pause_and_resume_with_real_agents(browser, asgi_server, coordinator, organizer, tmp_path,
                                                               screenshot, credit_beat):
    olga = browser.new_page(base_url=asgi_server)
    log_in(olga, organizer.username)
    organizer_creates_a_run(olga, corpus_write(tmp_path / "corpus.txt", n_lines=3000))
    coordinator.sync()  # the backbone peer whose addresses the join answer hands out
    assert Run.objects.get(slug=SLUG).initial_peers

    rumana = browser.new_page(base_url=asgi_server)
    secret, run = volunteer_signs_up_and_gets_the_join_command(rumana, asgi_server)
    nusrat = UserFactory(username="nusrat")
    _, nusrat_secret = token_create(user=nusrat, name="desktop")
    agents = {
        "rumana": agent(asgi_server, secret, tmp_path / "rumana", "600s", run=run),  # the command the page showed
        "nusrat": agent(asgi_server, nusrat_secret, tmp_path / "nusrat", "600s", run=run),
    }
    logs = {name: tmp_path / f"{name}.log" for name in agents}
    try:
        rumana.goto(f"/runs/{SLUG}/")
        expect(rumana.locator("#live")).to_have_class("connected")
        rumana.evaluate("window.__not_reloaded = true")
        # The coordinator's monitor confirms the agents' epochs as they close; boards show confirmed credit.
        serve_until(coordinator, lambda: RunCredit.objects.filter(run__slug=SLUG, samples_verified__gt=0).count() == 2,
                    300, "both volunteers' first confirmed credit")
        row = rumana.locator("#leaderboard tr[data-name='rumana']")
        expect(row).to_be_visible(timeout=60_000)
        expect(rumana.locator("#leaderboard tr[data-name='nusrat']")).to_be_visible(timeout=60_000)
        assert rumana.evaluate("window.__not_reloaded") is True
        screenshot(rumana, "story-live-leaderboard")
        assert csp_violations(rumana) == [], "the live socket, charts and board work under the policy"

        olga = organizer_returns(browser, asgi_server, organizer)
        olga.get_by_role("button", name="Pause").click()
        expect(olga.locator("#run-status")).to_have_text("Paused")
        for name, log in logs.items():
            wait_for(lambda log=log: "paused" in log.read_text(errors="replace"), 60, f"{name}'s agent to notice the pause")
        paused_at = {name: reports_of(name) for name in agents}
        reached = {name: epoch_reached(name) for name in agents}
        time.sleep(10)  # long enough for several report intervals (2 s) of an agent that kept training
        assert all(reports_of(name) <= paused_at[name] + 1 for name in agents), "no training while paused"
        assert all(process.poll() is None for process in agents.values()), "agents wait instead of exiting"

        olga = organizer_returns(browser, asgi_server, organizer)
        olga.get_by_role("button", name="Resume").click()
        expect(olga.locator("#run-status")).to_have_text("Active")
        for name in agents:
            wait_for(lambda name=name: TrainingSession.objects.filter(user__username=name).count() == 2, 150,
                     f"{name}'s agent to rejoin by itself")
            resumed = TrainingSession.objects.filter(user__username=name).latest("started_at")
            wait_for(lambda resumed=resumed: ContributionEvent.objects.filter(session=resumed).exists(), 120,
                     f"{name}'s reports after resuming")
        assert User.objects.get(username="rumana").training_sessions.count() == 2
        # Each agent kept its state at the pause; the first back resumed from it (the other from that peer),
        # so the run went on from where it was rather than from its last checkpoint or fresh weights.
        assert all("Kept this peer's state of epoch" in log.read_text(errors="replace") for log in logs.values())
        resumed = [TrainingSession.objects.filter(user__username=name).latest("started_at") for name in agents]
        resumed_from = ContributionEvent.objects.filter(session__in=resumed).aggregate(epoch=Min("local_epoch"))["epoch"]
        assert resumed_from >= min(reached.values()), (resumed_from, reached)

        # The coordinator saves the collaboration's state every 2 epochs; the organizer downloads it.
        def checkpoint_saved() -> bool:
            coordinator.sync()  # ticks the checkpointer (on this, the main thread, as the command does)
            return Checkpoint.objects.filter(run__slug=SLUG).exists()

        wait_for(checkpoint_saved, 300, "a checkpoint")
        olga = organizer_returns(browser, asgi_server, organizer)
        with olga.expect_download() as download:
            olga.locator("#checkpoints").get_by_role("link", name="Download").first.click()
        saved = tmp_path / "checkpoint.zip"
        download.value.save_as(saved)
        with zipfile.ZipFile(saved) as archive:
            assert {"config.json", "metadata.json", "tokenizer.json"} <= {Path(name).name for name in archive.namelist()}
        screenshot(olga, "story-run-page-organizer")
    finally:
        for process in agents.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in agents.values():
            try:
                process.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a stuck agent is killed below
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()
