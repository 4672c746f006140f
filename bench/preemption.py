"""Preemption: what a machine that comes and goes costs on the demo (issue 32, docs/benchmarks.md).

The same processes as ``manage.py demo`` (web server, Celery worker with beat, coordinator, two peer agents) on a
fresh var directory. Beside them a third volunteer's agent starts cold, trains until ``--verified`` of its epochs
are verified, and is killed without notice (SIGKILL to its process group, as a notebook's kernel dies); it is
started again at once in the same environment (its spool and home), trains again, and is given a cloud's
preemption notice (SIGTERM). Printed: the cold start's seconds to its first acknowledged report (the baseline),
the restart's (from the kill: the state download included) and their ratio; what the kill cost (the samples
of the epoch it cut short, computed and never credited, in seconds of the session's compute) and what the
killed session lost before it, and why; whether the killed session's pending reports all arrived;
how many sessions the volunteer's page shows training; the seconds from SIGTERM to the agent's exit.

Run ``python -m bench.preemption --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

from bench.demo_lab import demo_lab, process_start, process_stop, services_stop, uptime

NOTICE_S = 30.0  # a cloud's preemption notice


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.preemption", description=__doc__.split("\n\n")[0])
    parser.add_argument("--var-dir", help="the lab's var directory (default: a new temporary one)")
    parser.add_argument("--port", type=int, default=8031, help="the web server's port")
    parser.add_argument("--verified", type=int, default=3, help="verified epochs of a session before it is stopped")
    parser.add_argument("--timeout", type=float, default=600, help="seconds any one wait may take")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    lab = demo_lab(var_dir=args.var_dir, prefix="dedloc-preemption-", volunteers=2, port=args.port)
    from django.utils import timezone

    from accounts.models import User
    from peer_agent.spool import spool_read
    from runs.credit.volunteers import volunteer_machines
    from runs.management.commands.demo import agent_launch, backbone_wait
    from runs.models import ContributionEvent, SessionEpoch, TrainingSession, epoch_confirmed_samples

    print(f"var dir {lab.var_dir}; uptime: {uptime()}", flush=True)
    launched = timezone.now()
    services = [process_start(command, {}, log) for _, command, log in lab.services]
    agents = []

    def wait(condition, what: str) -> None:
        deadline = time.monotonic() + args.timeout
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit(f"gave up waiting for {what} after {args.timeout:g} s")
            time.sleep(0.5)

    def first_ack_after(session_pk_above: int) -> float:
        wait(lambda: ContributionEvent.objects.filter(session__user=mover, session__pk__gt=session_pk_above).exists(),
             "a first acknowledged report")
        return time.monotonic()

    def verified(session: TrainingSession) -> bool:
        return SessionEpoch.objects.filter(session=session, status="verified").count() >= args.verified

    try:
        backbone_wait(lab.run, since=launched)
        for volunteer in lab.volunteers:
            command, env = agent_launch(volunteer, lab.url, lab.var_dir / "agents" / volunteer.username)
            agents.append(process_start(command, env, lab.logs / f"{volunteer.username}.log"))
        mover = User.objects.create_user(username="preempted", email="preempted@demo.invalid",
                                         email_verified_at=timezone.now())
        home = lab.var_dir / "agents" / mover.username
        command, env = agent_launch(mover, lab.url, home)
        started = time.monotonic()
        agents.append(process_start(command, env, lab.logs / "preempted.log"))
        cold_s = first_ack_after(0) - started
        killed = TrainingSession.objects.get(user=mover)
        wait(lambda: verified(killed), f"{args.verified} verified epochs of the first session")

        os.killpg(agents[-1].pid, signal.SIGKILL)
        agents[-1].wait()
        killed_at = time.monotonic()
        _, spooled = spool_read(home / "spool" / f"session-{killed.pk}.jsonl")
        agents.append(process_start(command, env, lab.logs / "preempted.log"))
        restart_s = first_ack_after(killed.pk) - killed_at
        restarted = TrainingSession.objects.exclude(pk=killed.pk).get(user=mover)
        training = [machine["name"] for machine in volunteer_machines(user=mover) if machine["state"] == "training"]
        wait(lambda: ContributionEvent.objects.filter(session=killed).count() >= spooled.last_seq,
             "the killed session's pending reports")
        wait(lambda: not SessionEpoch.objects.filter(session=killed, status="provisional").exists(),
             "the killed session's epochs judged")
        wait(lambda: verified(restarted), f"{args.verified} verified epochs of the new session")

        os.killpg(agents[-1].pid, signal.SIGTERM)
        noticed = time.monotonic()
        agents[-1].wait(timeout=NOTICE_S)
        stop_s = time.monotonic() - noticed
        _, left = spool_read(home / "spool" / f"session-{restarted.pk}.jsonl")
    finally:
        for process in agents:
            process_stop(process)
        services_stop(services)

    def confirmed(row: SessionEpoch) -> int:
        return epoch_confirmed_samples(status=row.status, reported=row.reported_samples, announced=row.announced_samples)

    rows = list(SessionEpoch.objects.filter(session=killed).order_by("epoch"))
    last = rows[-1]  # the epoch the kill cut short: computed (its peer announced it), never or partly reported
    at_kill = max(last.announced_samples or 0, last.reported_samples) - confirmed(last)
    before = [row for row in rows[:-1] if confirmed(row) < row.reported_samples]
    reports = ContributionEvent.objects.filter(session=killed)
    seconds = max(1e-9, (reports.latest("sent_at").sent_at - killed.started_at).total_seconds())
    rate = sum(reports.values_list("samples", flat=True)) / seconds
    print(f"cold start to first acknowledged report: {cold_s:.1f} s (baseline)")
    print(f"kill to the restart's first acknowledged report: {restart_s:.1f} s ({restart_s / cold_s:.2f} of the cold start)")
    print(f"the kill cost epoch {last.epoch}'s {at_kill} samples, computed and never credited "
          f"(~{at_kill / max(rate, 1e-9):.1f} s of the session's compute at {rate:.1f} samples/s); "
          f"{spooled.last_seq - spooled.acked_reports} reports were "
          f"pending at the kill, all {spooled.last_seq} arrived")
    print(f"before the kill the session lost {sum(row.reported_samples - confirmed(row) for row in before)} of "
          f"{sum(row.reported_samples for row in rows)} reported samples: "
          f"{[(row.epoch, row.status, row.detail[:60]) for row in before]}")
    print(f"machines training on the volunteer's page after the restart: {len(training)} {training}")
    print(f"SIGTERM to exit: {stop_s:.1f} s (exit {agents[-1].returncode}, {len(left.pending)} reports left pending)")
    print(f"uptime: {uptime()}")


if __name__ == "__main__":
    main()
