"""`peer-agent aggregate` against a live portal and its coordinator: an organizer's aggregator joins a
trainer's averaging rounds, and the portal records it as an aggregator session with no samples."""

import os
import signal

import pytest
from django.db.models import Max

from accounts.services import token_create
from harness.processes import children_reap
from runs.models import ContributionEvent, TrainingSession
from tests.e2e.agents import agent, small_run, wait_for
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]


def test_an_organizers_aggregator_helps_a_trainer_average_and_claims_nothing(asgi_server, coordinator, organizer,
                                                                               tmp_path):
    run = small_run(organizer)
    coordinator.sync()
    amina = UserFactory(username="amina")
    homes = {"amina": tmp_path / "amina", "olga": tmp_path / "olga"}
    processes = {
        "amina": agent(asgi_server, token_create(user=amina, name="e2e")[1], homes["amina"], "600s"),
        "olga": agent(asgi_server, token_create(user=organizer, name="server")[1], homes["olga"], "600s",
                      command_name="aggregate"),
    }
    log = homes["olga"].parent / "olga.log"
    try:
        wait_for(lambda: TrainingSession.objects.filter(run=run, role="aggregator").exists(), 180, "the aggregator's join")
        wait_for(lambda: ContributionEvent.objects.filter(session__user=amina, local_epoch__gte=3).exists(), 300,
                 "the trainer to reach epoch 3")
        wait_for(lambda: "Averaged gradients in a group of 2 peers" in log.read_text(), 120,
                 "the aggregator to average in the trainer's gradient round")
        for name, process in processes.items():
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=120) == 0, (homes[name].parent / f"{name}.log").read_text()[-3000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    aggregator = TrainingSession.objects.get(run=run, role="aggregator")
    assert aggregator.user == organizer
    assert not ContributionEvent.objects.filter(session=aggregator).exists(), "an aggregator reports no samples"
    assert not aggregator.rejections.exists()
    assert ContributionEvent.objects.filter(session__user=amina).aggregate(epoch=Max("local_epoch"))["epoch"] >= 3
    assert "as aggregator session" in log.read_text()
