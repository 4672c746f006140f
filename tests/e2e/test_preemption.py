"""Machines that come and go (issue 32), with the real agent, portal and swarm: a notebook's kernel killed without
notice (SIGKILL to the agent's process group, mid-epoch) and started again in the same environment, then a
cloud's preemption notice (SIGTERM to the agent's process, as `docker stop` sends it; 30 s).

Every report the portal acknowledged counts once and the killed session's unacknowledged ones arrive with
the next start; the restart ends the session it replaces, so the volunteer's page shows one machine; SIGTERM
ends the agent within the notice with its spool drained and its peer gone from the swarm. It prints what the
kill cost (the killed session's samples that earned nothing, in seconds of its compute) and the restart's
time to its first acknowledged report (docs/benchmarks.md)."""

import os
import signal
import time

import pytest
from django.utils import timezone

from accounts.services import token_create
from harness.processes import children_reap
from peer_agent.spool import spool_read
from runs.credit.volunteers import volunteer_machines
from runs.models import ContributionEvent, ReportRejection, Run, RunSample, SessionEpoch, TrainingSession, epoch_confirmed_samples
from runs.swarm import monitor
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]
NOTICE_S = 30.0  # a cloud's preemption notice: what Google Cloud gives a preemptible VM


def test_a_killed_agent_restarts_as_the_same_machine_and_meets_a_preemption_notice(
    asgi_server, coordinator, organizer, tmp_path, monkeypatch
):
    monkeypatch.setattr(monitor, "GRACE_S", 6.0)  # agents report every 2 s here
    run = small_run(organizer, target_batch_size=128)
    serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
    amina = UserFactory(username="amina")
    secret = token_create(user=amina, name="kernel")[1]
    home = tmp_path / "amina"
    processes = [agent(asgi_server, secret, home, "420s")]

    def events(**where):
        return ContributionEvent.objects.filter(session__user=amina, **where)

    try:
        serve_until(coordinator, lambda: SessionEpoch.objects.filter(session__user=amina, status="verified").count() >= 3,
                    300, "three verified epochs")
        killed = TrainingSession.objects.get(user=amina)
        os.killpg(processes[0].pid, signal.SIGKILL)
        processes[0].wait()
        killed_at = timezone.now()
        _, spooled = spool_read(home / "spool" / f"session-{killed.pk}.jsonl")
        processes.append(agent(asgi_server, secret, home, "420s"))
        serve_until(coordinator, lambda: events().exclude(session=killed).exists(), 240,
                    "the new session's first acknowledged report")
        first_ack_s = (events().exclude(session=killed).earliest("received_at").received_at - killed_at).total_seconds()
        restarted = TrainingSession.objects.exclude(pk=killed.pk).get(user=amina)

        killed.refresh_from_db()
        assert killed.ended_at is not None, "the restart ended the session it replaces"
        machines = volunteer_machines(user=amina)
        assert [(machine["name"], machine["state"]) for machine in machines] == [("kernel", "training")]
        serve_until(coordinator, lambda: events(session=killed).count() >= spooled.last_seq, 120,
                    "the killed session's unacknowledged reports")
        assert sorted(events(session=killed).values_list("seq", flat=True)) == list(range(1, spooled.last_seq + 1)), \
            "every report the killed agent spooled, each once"
        serve_until(coordinator, lambda: SessionEpoch.objects.filter(session=restarted, status="verified").count() >= 2,
                    300, "two verified epochs of the new session")

        # The notice as `docker stop` gives it, to the container's first process: hivemind's processes live on
        # while the agent says goodbye. A host's shutdown signals every process at once; hivemind's die then,
        # and the swarm counts the peer until its progress record lapses (hivemind's metadata_expiration, 60 s).
        os.kill(processes[1].pid, signal.SIGTERM)
        noticed = time.monotonic()
        processes[1].wait(timeout=NOTICE_S)
        stopped_s = time.monotonic() - noticed
        assert processes[1].returncode == 0
        _, left = spool_read(home / "spool" / f"session-{restarted.pk}.jsonl")
        assert not left.pending, "the spool was drained before the agent exited"
        assert events(session=restarted).count() == left.last_seq
        assert not ReportRejection.objects.filter(session__user=amina).exists(), [
            (row.session_id, row.seq, row.code, row.detail) for row in ReportRejection.objects.filter(session__user=amina)
        ] + list(events().order_by("session", "seq").values_list("session", "seq", "samples", "samples_per_second"))
        serve_until(coordinator, lambda: RunSample.objects.filter(run=run).latest("at").alive_peers == 0, 20,
                    "its peer gone from the swarm")
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        children_reap()

    rows = SessionEpoch.objects.filter(session=killed)
    reported = sum(row.reported_samples for row in rows)
    confirmed = sum(epoch_confirmed_samples(status=row.status, reported=row.reported_samples,
                                            announced=row.announced_samples) for row in rows)
    rate = sum(events(session=killed).values_list("samples", flat=True)) / max(
        1e-9, (killed.last_seen_at - killed.started_at).total_seconds())
    print(f"kill: {reported - confirmed} of {reported} samples of the killed session earned nothing "
          f"(~{(reported - confirmed) / max(rate, 1e-9):.0f} s of its compute at {rate:.1f} samples/s); "
          f"restart to first acknowledged report {first_ack_s:.0f} s; SIGTERM to exit {stopped_s:.1f} s")
