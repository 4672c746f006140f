"""A run with two backbone peers, on two coordinators (two hosts in production): when the one that
holds the run's duties is killed mid-run, the volunteer training goes on, a newcomer joins through
the survivor, and the survivor takes the checkpoints over."""

import os
import signal

import pytest
from django.utils import timezone

from accounts.services import token_create
from harness.processes import children_reap
from runs.models import Backbone, Checkpoint, ContributionEvent, Run
from runs.swarm.coordinator import Coordinator
from tests.e2e.agents import agent, backbone_kill, small_run, wait_for
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]


def test_killing_the_backbone_peer_that_holds_the_duties_leaves_training_joins_and_checkpoints_going(
    asgi_server, coordinator, organizer, settings, tmp_path
):
    settings.COORDINATOR_HEARTBEAT_STALE_SECONDS = 8
    settings.COORDINATOR_DUTIES_LEASE_SECONDS = 20
    run = small_run(organizer)
    config = run.config
    config["averaging"].update(checkpoint_every_epochs=1, checkpoint_every_minutes=None)
    Run.objects.filter(pk=run.pk).update(config=config)
    amina, rahim = UserFactory(username="amina"), UserFactory(username="rahim")
    second = Coordinator(interval=1.0, state_dir=tmp_path / "second-host")
    coordinators = [coordinator, second]

    def serve_until(condition, timeout: float, what: str) -> None:
        def cycled() -> bool:
            for each in coordinators:
                each.cycle()
            return condition()
        wait_for(cycled, timeout, what)

    processes = {}
    try:
        serve_until(lambda: Backbone.objects.filter(run=run).count() == 2, 120, "both backbone peers")
        first_peer, second_peer = coordinator.peers[run.pk], second.peers[run.pk]
        assert first_peer.holds_duties and not second_peer.holds_duties
        assert Run.objects.get(pk=run.pk).initial_peers == first_peer.maddrs + second_peer.maddrs

        processes["amina"] = agent(asgi_server, token_create(user=amina, name="e2e")[1], tmp_path / "amina", "900s")
        serve_until(lambda: ContributionEvent.objects.filter(session__user=amina).exists()
                    and Checkpoint.objects.filter(run=run).exists(), 300,
                    "amina to train and the first backbone peer to save a checkpoint")

        # The host of the peer that holds the duties dies without a word.
        killed_at = timezone.now()
        last_epoch = Checkpoint.objects.filter(run=run).latest("epoch").epoch
        backbone_kill(coordinator)
        coordinators.remove(coordinator)

        serve_until(lambda: second_peer.holds_duties, 120, "the second backbone peer to take the duties over")
        serve_until(lambda: Run.objects.get(pk=run.pk).initial_peers == second_peer.maddrs, 60,
                    "joins to stop naming the dead backbone peer")
        processes["rahim"] = agent(asgi_server, token_create(user=rahim, name="e2e")[1], tmp_path / "rahim", "900s")
        serve_until(lambda: ContributionEvent.objects.filter(session__user=rahim).exists(), 300,
                    "the newcomer rahim to join through the surviving backbone peer and train")
        serve_until(lambda: ContributionEvent.objects.filter(session__user=amina, received_at__gt=killed_at).exists()
                    and Checkpoint.objects.filter(run=run, epoch__gt=last_epoch, created_at__gt=killed_at).exists(),
                    300, "amina's training and the checkpoints to go on")

        for process in processes.values():
            process.send_signal(signal.SIGINT)
        for name, process in processes.items():
            assert process.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        for peer in second.peers.values():
            peer.shutdown()
        children_reap()
