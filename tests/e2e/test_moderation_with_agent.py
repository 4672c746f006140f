"""An organizer bans a volunteer while the volunteer's agent trains: the agent ends with a message.
(Pausing and resuming with real agents is part of tests/browser/test_full_story.py.)"""

import os
import signal

import pytest

from accounts.services import token_create
from harness.processes import children_reap
from runs.models import ContributionEvent, Run
from runs.setup import services
from tests.e2e.agents import agent, small_run, wait_for
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]


def test_a_ban_ends_a_training_agent_with_a_message(asgi_server, coordinator, organizer, tmp_path):
    run = small_run(organizer)
    coordinator.sync()
    nusrat = UserFactory(username="nusrat")
    _, secret = token_create(user=nusrat, name="e2e")
    home = tmp_path / "nusrat"
    process = agent(asgi_server, secret, home, "400s")
    log = tmp_path / "nusrat.log"
    try:
        wait_for(lambda: ContributionEvent.objects.filter(session__user=nusrat).count() >= 2, 240, "reports")

        services.run_ban(run=Run.objects.get(pk=run.pk), actor=organizer, user=nusrat, reason="test")
        assert process.wait(timeout=120) == 3, log.read_text(errors="replace")[-3000:]
        assert "banned" in log.read_text(errors="replace")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        children_reap()
