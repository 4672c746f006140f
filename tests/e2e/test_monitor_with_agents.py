"""The coordinator's monitor with real agents against a live portal: the run's series follows the
swarm, an honest agent's reports become verified credit, a dishonest agent's excess is flagged
for the organizer, and a restarted coordinator resumes without judging anything twice."""

import os
import signal

import pytest
from django.db.models import Max, Min
from django.test import Client
from django.urls import reverse

from accounts.services import token_create
from harness.processes import children_reap
from runs.credit.verification import EpochLimits
from runs.models import Run, RunSample, SessionEpoch
from runs.swarm import monitor
from runs.swarm.coordinator import Coordinator
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]


def judged(user, status):
    return SessionEpoch.objects.filter(session__user=user, status=status)


def test_monitor_verifies_honest_credit_flags_a_double_reporter_and_survives_a_restart(
    asgi_server, coordinator, organizer, tmp_path, monkeypatch, settings
):
    monkeypatch.setattr(monitor, "GRACE_S", 6.0)  # agents report every 2 s here
    run = small_run(organizer)
    serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
    honest, cheat = UserFactory(username="amina"), UserFactory(username="rahim")
    homes = {user: tmp_path / user.username for user in (honest, cheat)}
    processes = {
        honest: agent(asgi_server, token_create(user=honest, name="e2e")[1], homes[honest], "400s"),
        cheat: agent(asgi_server, token_create(user=cheat, name="e2e")[1], homes[cheat], "400s",
                     module="tests.e2e.dishonest_agent"),
    }
    try:
        serve_until(coordinator, lambda: judged(honest, "verified").filter(reported_samples__gt=0).count() >= 3
                    and judged(cheat, "flagged").exists(), 300, "verified and flagged epochs")
        series = RunSample.objects.filter(run=run)
        assert series.filter(alive_peers=2).exists(), "the series saw both peers"
        span = series.aggregate(first=Min("global_epoch"), last=Max("global_epoch"))
        assert span["last"] - span["first"] >= 3, f"the series follows the epochs: {span}"

        # Restart: the coordinator stops (its backbone peer leaves), a new process takes over.
        peer_id = Run.objects.get(pk=run.pk).coordinator_peer_id
        before = {row.pk: (row.status, row.reported_samples, row.checked_at) for row in SessionEpoch.objects.all()}
        for peer in coordinator.peers.values():
            peer.shutdown()
        coordinator.peers.clear()
        restarted = Coordinator(interval=1.0)
        try:
            serve_until(restarted, lambda: restarted.peers, 60, "the restarted coordinator")
            assert Run.objects.get(pk=run.pk).coordinator_peer_id == peer_id, "the same peer id after a restart"
            restarted_at = RunSample.objects.filter(run=run).latest("at").at
            last_judged = max(epoch for epoch in SessionEpoch.objects.filter(session__user=honest)
                              .exclude(status="provisional").values_list("epoch", flat=True))
            serve_until(restarted, lambda: judged(honest, "verified").filter(epoch__gt=last_judged + 1).exists(),
                        180, "epochs judged after the restart")
            assert RunSample.objects.filter(run=run, at__gt=restarted_at, alive_peers=2).exists()
        finally:
            for peer in restarted.peers.values():
                peer.shutdown()
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    for row in SessionEpoch.objects.filter(pk__in=before).exclude(status="provisional"):
        if (before[row.pk][0], row.status) == ("flagged", "rejected"):
            # The evidence came after the flag: a commitment the validator could not check (the restarted one
            # holds no state of the epochs before it) earns nothing, flagged or not (runs/credit/verification.py).
            assert row.session.commitments.filter(epoch=row.epoch, outcome__in=["unchecked", "diverged"]).exists(), \
                f"flagged epoch {row.epoch} rejected with no commitment judged off the swarm"
            continue
        if before[row.pk][0] != "provisional" and row.reported_samples == before[row.pk][1]:
            assert (row.status, row.checked_at) == before[row.pk][::2], f"epoch {row.epoch} was judged again"

    limits = EpochLimits.for_run(run)
    honest_rows = list(judged(honest, "verified").filter(reported_samples__gt=0))
    assert not judged(honest, "flagged").exists(), [row.detail for row in judged(honest, "flagged")]
    reported = sum(row.reported_samples for row in honest_rows)
    credited = sum(min(row.reported_samples, row.announced_samples) for row in honest_rows)
    assert credited >= reported - len(honest_rows) * limits.step_samples, "honest reports are verified in full"

    for row in judged(cheat, "verified"):  # only epochs where doubling stayed within one step's slack
        assert row.reported_samples <= row.announced_samples * (1 + limits.tolerance) + limits.step_samples
    assert all(row.reported_samples >= 2 * row.announced_samples - limits.step_samples for row in judged(cheat, "flagged"))
    flags_page = Client()
    flags_page.force_login(organizer)
    page = flags_page.get(reverse("run-flags", args=[run.slug])).content.decode()
    assert "rahim" in page and "amina" not in page
