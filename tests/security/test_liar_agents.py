"""A liar running the real agent with parts of its ``Trainer`` swapped (tests/security/liar_agent.py), in a
real swarm beside an honest agent, against a live portal and coordinator (issue 29). Before, such an
agent earned 15.7 confirmed samples per example it computed and ranked first: its faked steps hid
behind a claimed divergence, its dark epochs' late commitments were vouched for by one real step, and
one commitment could stall the validator. The rule: no strategy earns more confirmed credit per example
it really computes than an honest agent, and the honest agents keep their credit. The liar also serves
a state of its own under a high priority (``capture``), which hivemind's download would have held as
the swarm's.

The coordinator schedules its spot checks for validator workers (``SPOT_CHECK_WORKERS``, docs/deploy.md): the
liar's commitments are judged on states the coordinator stored and the worker's task read back
(runs/swarm/recompute.py), run here in the coordinator's check thread by the tests' inline Celery
(tests/conftest.py). The coordinator's own recomputation is the same ``Recomputer``; it judges real agents in
tests/e2e/test_spot_checks_with_agents.py."""

import os
import re
import signal
from collections import Counter

import pytest
from django.db.models import Exists, OuterRef

from accounts.services import token_create
from harness.processes import children_reap
from runs.credit.rollup import credit_rollup
from runs.ingest.reports import COMMITMENT_WINDOW_EPOCHS
from runs.models import ReportRejection, Run, RunCredit, SessionEpoch, StepCommitment, TrainingSession, epoch_confirmed_samples
from runs.swarm import monitor
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory
from tests.security import liar_agent

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]
# Credit per computed example an honest agent gets is below 1 (its last steps of an epoch can go
# uncounted); the bar of issue 29 allows a liar 1.1.
LIAR_BAR = 1.1


def confirmed(user) -> int:
    rows = SessionEpoch.objects.filter(session__user=user).values_list("status", "reported_samples", "announced_samples")
    return sum(epoch_confirmed_samples(status=status, reported=reported, announced=announced)
               for status, reported, announced in rows)


def test_a_liar_mixing_every_strategy_earns_no_more_than_it_computes_and_ranks_below_the_honest_agent(
    asgi_server, coordinator, organizer, tmp_path, monkeypatch, settings
):
    assert liar_agent.DARK_DELAY_EPOCHS > COMMITMENT_WINDOW_EPOCHS + 1, "the dark epochs' commitments come late"
    settings.SPOT_CHECK_WORKERS = True
    monkeypatch.setattr(monitor, "GRACE_S", 6.0)  # agents report every 2 s here
    run = small_run(organizer)
    serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
    # Two honest agents: the validator holds a state only when two peers serve the same (runs/swarm/spotcheck.py),
    # and the liar serves its own all along ("capture").
    honest, second, liar = UserFactory(username="amina"), UserFactory(username="rahim"), UserFactory(username="mallory")
    processes = [
        agent(asgi_server, token_create(user=honest, name="e2e")[1], tmp_path / "amina", "420s"),
        agent(asgi_server, token_create(user=second, name="e2e")[1], tmp_path / "rahim", "420s"),
        agent(asgi_server, token_create(user=liar, name="e2e")[1], tmp_path / "mallory", "420s",
              module="tests.security.liar_agent"),
    ]
    commitments = StepCommitment.objects.filter(session__user=liar)

    def judged(strategy: str) -> int:
        """The liar's commitments of epochs it played ``strategy`` in that the portal has judged."""
        epochs = commitments.exclude(outcome="pending").values_list("epoch", flat=True)
        return sum(liar_agent.strategy_of(epoch) == strategy for epoch in epochs)

    def liar_disagreements() -> int:
        """States the liar served unlike those two peers agreed on, as its organizers see them counted on its
        session (the flagged-credit page): the validator names its peer by the id its signed records name."""
        return sum(TrainingSession.objects.filter(user=liar).values_list("states_disagreed", flat=True))

    def suspended() -> bool:
        return TrainingSession.objects.filter(user=liar, suspended_at__isnull=False).exists()

    try:
        # A drawn shield step whose sketch falls near the held state is claimed there and fails its
        # recompute: two such epochs suspend the liar, and it plays no further strategy.
        # Each honest agent's verified epochs are counted where it computed something: on a loaded machine (CI49)
        # the liar was suspended within a minute, and rahim, slow to settle into the swarm, had 15 verified
        # epochs but 168 samples, as many confirmed as the liar's.
        serve_until(coordinator, lambda: (suspended() or judged("dark") >= 2 and judged("shield") >= 2
                                          and judged("probe") >= 2 and liar_disagreements() >= 3)
                    and all(SessionEpoch.objects.filter(session__user=user, status="verified",
                                                        reported_samples__gt=0).count() >= 12
                            for user in (honest, second)),
                    420, "the liar suspended or its commitments of every strategy judged and its own state "
                         "counted as a disagreement; each honest agent's epochs verified")
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()
    # A late commitment the liar sent in the seconds before the ingest refused its suspended session is stored
    # unchecked at the door, after the suspension flagged its epoch: the validator's next cycle rejects that epoch.
    flagged_off_the_swarm = SessionEpoch.objects.filter(session__user=liar, status="flagged").filter(Exists(
        commitments.filter(session_id=OuterRef("session_id"), epoch=OuterRef("epoch"),
                           outcome__in=["diverged", "unchecked"])))
    serve_until(coordinator, lambda: not flagged_off_the_swarm.exists(), 120,
                "the validator to reject the flagged epochs whose commitments were judged off the swarm")

    computed = int((tmp_path / "mallory" / "computed").read_text())
    for user in (honest, second, liar):  # the figures docs/trust.md quotes (pytest -s shows them)
        statuses = list(SessionEpoch.objects.filter(session__user=user).values_list("status", flat=True))
        reported = sum(SessionEpoch.objects.filter(session__user=user).values_list("reported_samples", flat=True))
        print(f"{user.username}: confirmed {confirmed(user)} of {reported} reported samples"
              + (f", {computed} computed" if user == liar else "")
              + f"; epochs {dict(sorted(Counter(statuses).items()))}; rejected for "
              + str(Counter(re.sub(r"\d+", "N", detail)[:60] for detail in SessionEpoch.objects.filter(
                  session__user=user, status="rejected").values_list("detail", flat=True)).most_common()))
    assert confirmed(liar) <= LIAR_BAR * computed, (confirmed(liar), computed, [
        (row.epoch, row.status, row.reported_samples, row.detail[:80]) for row in SessionEpoch.objects.filter(
            session__user=liar)])
    if not suspended():  # then it played every strategy twice (the wait above); a liar suspended early may have
        # closed no stall epoch yet (CI50: suspended in its ninth epoch). The rule alone: tests/runs/swarm/test_spot_checks.py.
        assert ReportRejection.objects.filter(session__user=liar, code="invalid_commitment",
                                              detail__contains="further than").exists(), "the stalling commitment"
    assert all(step[0] < 2**40 for stored in commitments for step in stored.steps)
    # Nothing it claimed off the swarm's state, or committed late, earned anything (an epoch it reported
    # nothing in is verified with nothing, before its late commitment comes; one it never reported in has no row).
    for epoch in commitments.filter(outcome__in=["diverged", "unchecked"]).values_list("epoch", flat=True):
        row = SessionEpoch.objects.filter(session__user=liar, epoch=epoch).first()
        assert row is None or row.status in ("rejected", "provisional") or row.reported_samples == 0, (
            row.epoch, row.status, row.detail)

    for user in (honest, second):
        checks = StepCommitment.objects.filter(session__user=user)
        assert checks.filter(outcome="passed").count() >= 5, f"the validator kept checking {user}"
        assert not checks.filter(outcome="failed").exists()
        flagged = SessionEpoch.objects.filter(session__user=user, status="flagged")
        assert not flagged.exists(), [(row.epoch, row.reported_samples, row.announced_samples, row.detail)
                                      for row in flagged]
        assert confirmed(liar) < confirmed(user)
    # The liar's state was never held as the swarm's: the honest agents' checks passed against the state
    # they agreed on, and one peer, the liar, served a state unlike the held one again and again.
    disagreements = coordinator.peers[run.pk].validator.disagreements
    liar_peer = (tmp_path / "mallory" / "peer_id").read_text()
    if not suspended():  # it served its own state all along, and the validator compared it again and again
        assert disagreements.get(liar_peer, 0) >= 3, (liar_peer, disagreements)
        assert disagreements[liar_peer] == max(disagreements.values()), (liar_peer, disagreements)
        tallied = {user.username: sum(TrainingSession.objects.filter(user=user).values_list("states_disagreed", flat=True))
                   for user in (honest, second, liar)}
        assert tallied["mallory"] >= 1 and tallied["mallory"] == max(tallied.values()), tallied
    # A liar suspended early may never have had its state compared (CI63: suspended two minutes in at load 14,
    # while the holder compared only an honest agent's, out of sync twice): its credit, above, is what counts.
    credit_rollup()
    liar_credit = RunCredit.objects.filter(run=run, user=liar).values_list("credit", flat=True).first() or 0
    for user in (honest, second):
        assert liar_credit < RunCredit.objects.get(run=run, user=user).credit, f"the liar ranks below {user}"
