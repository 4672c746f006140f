"""A coordinator that dies while its run has no agents comes back: its backbone peer finds none of
the peers it remembers, starts a fresh swarm and forgets them. An agent started while it is down
says so in one sentence, waits, and trains once it is back."""

import json
import os
import signal

import pytest

from accounts.services import token_create
from harness.processes import children_reap
from runs.models import ContributionEvent, Run
from runs.swarm.coordinator import Coordinator
from tests.e2e.agents import agent, backbone_kill, serve_until, small_run, wait_for
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]

WAITING = "is not reachable now; the agent will retry every 10 s"


def said(log) -> str:
    """What an agent wrote to its log, as one line (its console wraps long sentences)."""
    return " ".join(log.read_text(errors="replace").split()) if log.exists() else ""


def test_a_coordinator_killed_with_no_agents_comes_back_and_an_agent_waiting_for_it_then_trains(
    asgi_server, coordinator, organizer, settings, tmp_path
):
    settings.COORDINATOR_HEARTBEAT_STALE_SECONDS = 8
    run = small_run(organizer)
    amina, rahim = UserFactory(username="amina"), UserFactory(username="rahim")
    swarm_file = tmp_path / "coordinator" / f"{run.hivemind_run_id}.swarm"
    processes = {}
    try:
        serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
        processes["amina"] = agent(asgi_server, token_create(user=amina, name="e2e")[1], tmp_path / "amina", "600s")
        serve_until(coordinator, lambda: ContributionEvent.objects.filter(session__user=amina).exists()
                    and swarm_file.exists(), 240, "amina to train and the backbone peer to remember her")
        remembered = json.loads(swarm_file.read_text())
        processes["amina"].send_signal(signal.SIGINT)
        assert processes["amina"].wait(timeout=120) == 0
        # The run has no agents now; the coordinator dies without a word.
        backbone_kill(coordinator)

        rahim_log = tmp_path / "rahim.log"
        processes["rahim"] = agent(asgi_server, token_create(user=rahim, name="e2e")[1], tmp_path / "rahim", "600s")
        wait_for(lambda: WAITING in said(rahim_log), 120,
                 "the agent to say that the coordinator is not reachable")
        assert processes["rahim"].poll() is None, rahim_log.read_text(errors="replace")[-3000:]

        restarted = Coordinator(interval=1.0)
        try:
            serve_until(restarted, lambda: restarted.peers, 120, "the restarted coordinator's backbone peer")
            assert restarted.peers[run.pk].dht.is_alive()
            assert not swarm_file.exists() or set(json.loads(swarm_file.read_text())).isdisjoint(remembered), \
                "the peers that did not answer are forgotten"
            serve_until(restarted, lambda: ContributionEvent.objects.filter(session__user=rahim).exists(), 240,
                        "rahim to train once the coordinator is back")
            processes["rahim"].send_signal(signal.SIGINT)
            assert processes["rahim"].wait(timeout=120) == 0, rahim_log.read_text(errors="replace")[-3000:]
        finally:
            for peer in restarted.peers.values():
                peer.shutdown()
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    # Never the p2p daemon's error: the agent said what happened in a sentence and waited.
    assert "P2PDaemonError" not in said(rahim_log) and "failed to connect to bootstrap" not in said(rahim_log), \
        said(rahim_log)[-3000:]
