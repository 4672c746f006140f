"""Honest agents keep their credit (issue 29): one joins with ``--per-device-batch-size`` half the run's,
the other is killed mid-run and joins again (a new session that loads the swarm's state, while the
survivor's rounds fail for want of a partner). Every rule that keeps a liar from earning (tests/security/
test_liar_agents.py) must leave them at least 95% of the samples they reported, counted from the epoch
each session first stepped in with the swarm."""

import os
import signal

import pytest

from accounts.services import token_create
from harness.processes import children_reap
from runs.models import Run, SessionEpoch, StepCommitment, TrainingSession, epoch_confirmed_samples
from runs.swarm import monitor
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]
HONEST_BAR = 0.95
# A session's first epochs (joining: a state download, the first rounds) and twice as many last ones (cut off by
# the test, or not judged yet when it stops) are not counted.
SESSION_EDGE_EPOCHS = 2


def kept(user) -> tuple[int, int, list]:
    """Confirmed and reported samples of ``user``'s epochs, each session's first and last few left out, and
    the epochs that earned nothing (epoch, status, detail)."""
    confirmed = reported = 0
    lost = []
    for session in TrainingSession.objects.filter(user=user):
        rows = list(SessionEpoch.objects.filter(session=session).order_by("epoch"))
        for row in rows[SESSION_EDGE_EPOCHS:-2 * SESSION_EDGE_EPOCHS]:
            earned = epoch_confirmed_samples(status=row.status, reported=row.reported_samples,
                                             announced=row.announced_samples)
            confirmed, reported = confirmed + earned, reported + row.reported_samples
            if earned < row.reported_samples:
                lost.append((session.pk, row.epoch, row.status, row.detail[:90]))
    return confirmed, reported, lost


def test_honest_agents_with_an_override_a_restart_and_failed_rounds_keep_their_credit(
    asgi_server, coordinator, organizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(monitor, "GRACE_S", 6.0)  # agents report every 2 s here
    run = small_run(organizer)
    serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
    amina, rahim = UserFactory(username="amina"), UserFactory(username="rahim")
    secret = token_create(user=amina, name="e2e")[1]
    processes = [agent(asgi_server, secret, tmp_path / "amina", "420s"),
                 agent(asgi_server, token_create(user=rahim, name="e2e")[1], tmp_path / "rahim", "420s",
                       options=("--per-device-batch-size", "4"))]

    def verified(user, **where) -> int:
        return SessionEpoch.objects.filter(session__user=user, status="verified", **where).count()

    def judged_but_the_last(sessions: list[int]) -> bool:
        """Whether every epoch of ``sessions`` but their last few has been judged."""
        rows = SessionEpoch.objects.filter(session__pk__in=sessions)
        newest = max(rows.values_list("epoch", flat=True), default=0)
        return not rows.filter(status="provisional", epoch__lt=newest - 2 * SESSION_EDGE_EPOCHS).exists()

    try:
        serve_until(coordinator, lambda: verified(amina) >= 8 and verified(rahim) >= 8, 420,
                    "eight verified epochs of each agent")
        os.killpg(processes[0].pid, signal.SIGKILL)
        processes[0].wait()
        first_session = TrainingSession.objects.filter(user=amina).latest("pk").pk
        processes.append(agent(asgi_server, secret, tmp_path / "amina", "300s"))
        serve_until(coordinator, lambda: verified(amina, session__pk__gt=first_session) >= 8, 300,
                    "eight verified epochs of amina's second session")
        live = list(TrainingSession.objects.filter(run=run).exclude(pk=first_session).values_list("pk", flat=True))
        serve_until(coordinator, lambda: judged_but_the_last(live), 120, "the live sessions' epochs judged")
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    assert TrainingSession.objects.filter(user=amina).count() == 2
    declared = TrainingSession.objects.filter(user=rahim).values_list("micro_batch_size", flat=True).get()
    assert declared == 4, "the override is declared at join"
    for user in (amina, rahim):
        confirmed, reported, lost = kept(user)
        print(f"{user.username}: confirmed {confirmed} of {reported} reported samples; lost {lost}")
        assert reported > 0 and confirmed >= HONEST_BAR * reported, (user.username, confirmed, reported, lost)
        assert not SessionEpoch.objects.filter(session__user=user, status="flagged").exists()
        assert not StepCommitment.objects.filter(session__user=user, outcome="failed").exists()
