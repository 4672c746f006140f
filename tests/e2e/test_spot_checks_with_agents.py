"""Spot checks with real agents against a live portal and coordinator: a lazy agent that trains one
step in ten but announces, reports and commits to ten is caught, flagged, suspended and earns no
confirmed credit, while an honest agent in the same swarm keeps all of its credit (#14)."""

import os
import signal

import pytest
from django.test import Client
from django.urls import reverse

from accounts.services import token_create
from harness.processes import children_reap
from runs.credit.rollup import credit_rollup
from runs.models import Run, RunCredit, SessionEpoch, StepCommitment, TrainingSession
from runs.swarm import monitor
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]


def test_a_lazy_agent_is_caught_suspended_and_credited_nothing_while_an_honest_one_keeps_its_credit(
    asgi_server, coordinator, organizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(monitor, "GRACE_S", 6.0)  # agents report every 2 s here
    run = small_run(organizer)
    serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
    honest, lazy = UserFactory(username="amina"), UserFactory(username="rahim")
    processes = [
        agent(asgi_server, token_create(user=honest, name="e2e")[1], tmp_path / "amina", "400s"),
        agent(asgi_server, token_create(user=lazy, name="e2e")[1], tmp_path / "rahim", "400s",
              module="tests.e2e.lazy_agent"),
    ]
    checks = StepCommitment.objects.exclude(outcome=StepCommitment.Outcome.PENDING)
    try:
        serve_until(coordinator, lambda: TrainingSession.objects.filter(user=lazy, suspended_at__isnull=False).exists()
                    and SessionEpoch.objects.filter(session__user=honest, status="verified",
                                                    reported_samples__gt=0).count() >= 3,
                    400, "the lazy session suspended and honest epochs verified")
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    failed = checks.filter(session__user=lazy, outcome="failed")
    assert failed.count() >= 2, "suspended after its second failed check"
    for commitment in failed:  # the figures are kept for the organizer
        assert max(distance for _, distance in commitment.checked_steps) > 0.1
        assert "away from its committed fingerprint" in commitment.check_detail
    lazy_epochs = SessionEpoch.objects.filter(session__user=lazy)
    assert not lazy_epochs.filter(status__in=["verified", "accepted"]).exists(), [
        (row.epoch, row.status, row.detail) for row in lazy_epochs]
    assert lazy_epochs.filter(status="flagged", detail__contains="spot check").exists()

    assert not checks.filter(session__user=honest, outcome="failed").exists(), [
        commitment.check_detail for commitment in checks.filter(session__user=honest)]
    assert checks.filter(session__user=honest, outcome="passed").exists()
    # Each step's first micro-batch carries the sketch of the parameters it was computed at.
    assert all(len(commitment.steps[0]) == 4 for commitment in checks.filter(session__user=honest))
    honest_epochs = SessionEpoch.objects.filter(session__user=honest)
    assert not honest_epochs.filter(status="flagged").exists(), [row.detail for row in honest_epochs.filter(status="flagged")]

    credit_rollup()
    assert RunCredit.objects.get(run=run, user=honest).credit > 0
    assert not RunCredit.objects.filter(run=run, user=lazy, credit__gt=0).exists(), "checked credit 0"
    page = Client()
    page.force_login(organizer)
    flags = page.get(reverse("run-flags", args=[run.slug])).content.decode()
    assert "rahim" in flags and "spot check" in flags
