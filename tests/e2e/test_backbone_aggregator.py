"""A run whose organizer turned `averaging.backbone_aggregates` on, with a real coordinator and two real
agents: the backbone peer's aggregator joins their gradient rounds as hivemind's auxiliary, with a share
of the vector from its declared bandwidth, opens no session and earns nothing; training goes on; turning
the option off stops it, and so does a pause."""

import json
import os
import signal

import pytest
from django.db.models import Max
from hivemind.averaging.allreduce import AveragingMode

from accounts.services import token_create
from harness.processes import children_reap
from harness.swarm import averaging_rounds_recorder
from peer_agent import aggregation
from runs.models import Backbone, ContributionEvent, Run, TrainingSession
from runs.setup import services
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]


def test_the_backbone_peers_aggregator_takes_a_share_of_the_agents_rounds_and_earns_nothing(
    asgi_server, coordinator, organizer, settings, monkeypatch, tmp_path
):
    record = tmp_path / "rounds.jsonl"

    monkeypatch.setitem(aggregation.RUNNERS, "mean", averaging_rounds_recorder(record))
    monkeypatch.setenv("PEER_AGENT_BANDWIDTH_MBPS", "20")  # volunteers on thin links, as the agents declare it
    settings.COORDINATOR_AGGREGATOR_BANDWIDTH_MBPS = 500
    run = small_run(organizer)
    config = run.config
    config["averaging"].update(backbone_aggregates=True, matchmaking_time=2.0, averaging_timeout=20.0)
    # Epochs of several seconds: at 32 samples the two agents' epochs last about a second, shorter than
    # matchmaking, and they seldom meet in one round.
    config["training"]["target_batch_size"] = 128
    Run.objects.filter(pk=run.pk).update(config=config)
    amina, rahim = UserFactory(username="amina"), UserFactory(username="rahim")

    def rounds() -> list[dict]:
        lines = record.read_text().splitlines() if record.exists() else []
        return [entry for entry in map(json.loads, lines) if entry["kind"] == "gradients"]

    processes = {}
    try:
        serve_until(coordinator, lambda: run.pk in coordinator.peers and coordinator.peers[run.pk].aggregator, 180,
                    "the backbone peer's aggregator to start")
        aggregator_id = coordinator.peers[run.pk].aggregator.peer_id
        for user in (amina, rahim):
            processes[user.username] = agent(asgi_server, token_create(user=user, name="e2e")[1],
                                             tmp_path / user.username, "900s")
        serve_until(coordinator, lambda: any(len(entry["peers"]) == 3 for entry in rounds())
                    and ContributionEvent.objects.filter(session__user=rahim, local_epoch__gte=3).exists()
                    and ContributionEvent.objects.filter(session__user=amina, local_epoch__gte=3).exists(), 600,
                    "both agents to reach epoch 3 and average with the backbone's aggregator")
        backbone = Backbone.objects.get(run=run)
        assert backbone.aggregates and backbone.aggregator_rounds >= 1, "the health page sees its rounds"

        config["averaging"]["backbone_aggregates"] = False
        Run.objects.filter(pk=run.pk).update(config=config)
        aggregator = coordinator.peers[run.pk].aggregator.aggregator
        coordinator.cycle()
        assert coordinator.peers[run.pk].aggregator is None and not aggregator.dht.is_alive(), "off stops it"
        coordinator.peers[run.pk].heartbeat()
        assert not Backbone.objects.get(run=run).aggregates

        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for name, process in processes.items():
            assert process.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]

        config["averaging"]["backbone_aggregates"] = True  # on again: a new aggregator, then the organizer pauses
        Run.objects.filter(pk=run.pk).update(config=config)
        serve_until(coordinator, lambda: coordinator.peers[run.pk].aggregator, 180, "the aggregator to start again")
        rounds_before = coordinator.peers[run.pk].aggregator_rounds
        services.run_transition(run=Run.objects.get(pk=run.pk), actor=organizer, action="pause")
        coordinator.cycle()
        assert run.pk in coordinator.peers and coordinator.peers[run.pk].aggregator is None, "a pause stops it"
        assert coordinator.peers[run.pk].aggregator_rounds == rounds_before >= backbone.aggregator_rounds
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    with_it = [entry for entry in rounds() if aggregator_id in entry["peers"]]
    for entry in with_it:
        index = entry["peers"].index(aggregator_id)
        assert entry["modes"][index] == AveragingMode.AUX.value, "it joined as an auxiliary, sending nothing"
    with_both = [entry for entry in with_it if len(entry["peers"]) == 3]
    assert with_both, f"it never averaged with both agents: {rounds()}"
    for entry in with_both:  # with one trainer, keeping the vector where it is costs least, and the LP says so
        share = entry["fractions"][entry["peers"].index(aggregator_id)] / sum(entry["fractions"])
        assert share > 0.5, f"the partition gives the 500 Mbit/s aggregator the largest share, not {share:.2f}"
    sessions = TrainingSession.objects.filter(run=run)
    assert {session.user.username for session in sessions} == {"amina", "rahim"}, "the aggregator opened no session"
    assert set(sessions.values_list("role", flat=True)) == {"trainer"}
    assert not ContributionEvent.objects.exclude(session__user__in=[amina, rahim]).exists(), "it claimed no samples"
    assert ContributionEvent.objects.filter(session__user=amina).aggregate(epoch=Max("local_epoch"))["epoch"] >= 3
