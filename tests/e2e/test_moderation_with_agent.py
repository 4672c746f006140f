"""An organizer moderates a run while a real agent trains: pause stops it, resume brings it back
on its own, a ban ends it with a message."""

import os
import signal
import time

import pytest

from accounts.services import token_create
from runs import services
from runs.models import ContributionEvent, Run, TrainingSession
from tests.e2e.agents import agent, small_run, wait_for
from tests.factories import UserFactory
from tests.processes import children_reap

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]


def test_pause_resume_and_ban_reach_a_training_agent(asgi_server, coordinator, organizer, tmp_path):
    run = small_run(organizer)
    coordinator.sync()
    nusrat = UserFactory(username="nusrat")
    _, secret = token_create(user=nusrat, name="e2e")
    home = tmp_path / "nusrat"
    process = agent(asgi_server, secret, home, "400s")
    log = tmp_path / "nusrat.log"
    try:
        wait_for(lambda: ContributionEvent.objects.filter(session__user=nusrat).count() >= 2, 240, "reports")

        services.run_transition(run=Run.objects.get(pk=run.pk), actor=organizer, action="pause")
        wait_for(lambda: "paused" in log.read_text(errors="replace"), 60, "the agent to notice the pause")
        events = ContributionEvent.objects.filter(session__user=nusrat).count()
        time.sleep(12)
        assert ContributionEvent.objects.filter(session__user=nusrat).count() <= events + 1, "no training while paused"
        assert process.poll() is None, "the agent waits instead of exiting"

        services.run_transition(run=Run.objects.get(pk=run.pk), actor=organizer, action="resume")
        wait_for(lambda: TrainingSession.objects.filter(user=nusrat).count() == 2, 150, "the agent to rejoin by itself")
        resumed = TrainingSession.objects.filter(user=nusrat).latest("started_at")
        wait_for(lambda: ContributionEvent.objects.filter(session=resumed).exists(), 120, "reports after resuming")

        services.run_ban(run=Run.objects.get(pk=run.pk), actor=organizer, user=nusrat, reason="test")
        assert process.wait(timeout=120) == 3, log.read_text(errors="replace")[-3000:]
        assert "banned" in log.read_text(errors="replace")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        children_reap()
