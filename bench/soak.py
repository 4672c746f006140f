"""Soak: the portal, its worker and coordinator and local agents for a long while, with periodic kills.

The same processes as ``manage.py demo`` (web server, Celery worker with beat, coordinator, peer
agents through the real CLI and token flow) on a fresh var directory (SQLite unless DATABASE_URL
is set). Every ``--kill-every`` seconds one of them is killed with SIGKILL, process group and all,
and started again, in the order of ``--kills`` (an agent comes back on its own spool, so it
delivers what its killed session had not). The resident memory of each role (the process and its
children: hivemind's p2pd and averagers) is sampled every ``--sample-every`` seconds.

At the end the agents are stopped with SIGINT (they flush), and every agent's spool is compared
with what the portal stored: each acknowledged report stored exactly once, none pending. It prints
per role the memory after the warm-up (the baseline, same run), the peak and the end, with the
ratio end/baseline, and per incarnation the growth per 10 minutes; the samples go to a CSV file.

Run ``python -m bench.soak --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.demo_lab import ROOT, demo_lab, uptime


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the platform runs")
    parser.add_argument("--agents", type=int, default=2, choices=range(1, 5))
    parser.add_argument("--kill-every", type=float, default=300.0, help="seconds between two kills")
    parser.add_argument("--kills", default="agent,web,agent,coordinator,worker",
                        help="what is killed in turn: agent (each agent in turn), web, worker, coordinator")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between memory samples")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds before the baseline sample")
    parser.add_argument("--port", type=int, default=8017)
    parser.add_argument("--var-dir", default=None, help="where the portal keeps its files (default: a fresh temp dir)")
    return parser.parse_args()


@dataclass
class Role:
    """One long-lived part of the platform, restarted after each kill."""

    name: str
    command: list[str]
    env: dict
    log: Path
    process: subprocess.Popen | None = None
    incarnations: list[list[tuple[float, int]]] = field(default_factory=list)  # (time, rss) per life

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, env={**os.environ, **self.env},
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.incarnations.append([])

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def rss(self) -> int | None:
        """Resident bytes of the process and all its descendants; None if it is not running."""
        import psutil

        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        total = 0
        for process in tree:
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total if self.process.poll() is None else None


def _mb(value: float) -> str:
    return f"{value / 2**20:8.1f}"


def main() -> None:
    args = _parse()
    started = time.monotonic()
    lab = demo_lab(var_dir=args.var_dir, prefix="dedloc-soak-", volunteers=max(args.agents, 2), port=args.port)
    var_dir, logs, url, run, volunteers = lab.var_dir, lab.logs, lab.url, lab.run, lab.volunteers
    from django.db.models import Count, Sum

    from peer_agent.spool import spool_files, spool_read
    from runs.management.commands.demo import agent_launch, backbone_wait
    from runs.models import ContributionEvent

    print(f"var dir {var_dir}; {args.minutes:g} min, {args.agents} agents, a kill every {args.kill_every:g} s "
          f"({args.kills}); uptime: {uptime()}")
    roles = [Role(name, command, {}, log) for name, command, log in lab.services]
    from django.utils import timezone

    launched = timezone.now()
    for role in roles:
        role.start()
    backbone_wait(run, since=launched)
    agents = []
    for volunteer in volunteers[: args.agents]:
        home = var_dir / "agents" / volunteer.username
        command, env = agent_launch(volunteer, url, home)
        agents.append(Role(f"agent {volunteer.username}", command, env, logs / f"{volunteer.username}.log"))
        agents[-1].start()
    roles += agents
    print(f"started in {time.monotonic() - started:.0f} s: {', '.join(role.name for role in roles)}")

    agent_turn = itertools.cycle(agents)
    victims = itertools.cycle(args.kills.split(","))
    clock = time.monotonic()
    end, next_kill, kills = clock + args.minutes * 60, clock + args.kill_every, []
    samples_path = var_dir / "soak-memory.csv"
    with samples_path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["seconds", "role", "rss_bytes"])
        try:
            while time.monotonic() < end:
                now = time.monotonic()
                for role in roles:
                    rss = role.rss()
                    if rss is None:
                        raise SystemExit(f"{role.name} exited by itself (status {role.process.returncode}); see {role.log}")
                    role.incarnations[-1].append((now - clock, rss))
                    writer.writerow([f"{now - clock:.0f}", role.name, rss])
                file.flush()
                if now >= next_kill:
                    victim = next(victims)
                    role = next(agent_turn) if victim == "agent" else next(r for r in roles if r.name == victim)
                    role.kill()
                    role.start()
                    kills.append(f"{now - clock:.0f}s {role.name}")
                    print(f"{now - clock:6.0f} s  killed and restarted {role.name}", flush=True)
                    next_kill += args.kill_every
                time.sleep(max(0.0, args.sample_every - (time.monotonic() - now)))
        finally:
            for role in agents:  # SIGINT: they finish the step, flush their reports and leave
                if role.process.poll() is None:
                    os.kill(role.process.pid, signal.SIGINT)
            codes = {role.name: role.process.wait(timeout=120) for role in agents}
            lingering = []
            for role in roles:
                if role not in agents and role.process.poll() is None:
                    os.killpg(role.process.pid, signal.SIGTERM)
                    try:
                        role.process.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        lingering.append(role.name)
                        role.kill()

    print(f"\nran {(time.monotonic() - clock) / 60:.1f} min; kills: {', '.join(kills) or 'none'}; "
          f"agents' exit codes {codes}; still running 60 s after SIGTERM: {', '.join(lingering) or 'none'}; "
          f"uptime: {uptime()}")
    print(f"\n{'role':<16} {'lives':>5} {'baseline MB':>11} {'peak MB':>8} {'end MB':>8} {'end/baseline':>12}  "
          f"growth per 10 min of each life (MB, lives over 5 min)")
    for role in roles:
        points = [point for life in role.incarnations for point in life]
        baseline = next((rss for seconds, rss in points if seconds >= args.warmup), points[0][1])
        growth = []
        for life in role.incarnations:
            if len(life) > 2 and life[-1][0] - life[0][0] >= 300:
                times, values = [seconds for seconds, _ in life], [rss for _, rss in life]
                half = len(life) // 2  # the slope of the second half: past each life's own warm-up
                slope = statistics.linear_regression(times[half:], values[half:]).slope
                growth.append(f"{slope * 600 / 2**20:+.1f}")
        print(f"{role.name:<16} {len(role.incarnations):>5} {_mb(baseline):>11} {_mb(max(r for _, r in points)):>8} "
              f"{_mb(points[-1][1]):>8} {points[-1][1] / baseline:12.2f}  {', '.join(growth) or '-'}")

    stored = ContributionEvent.objects.filter(session__run=run)
    totals = stored.aggregate(reports=Count("pk"), samples=Sum("samples"))
    problems, acked, pending = [], 0, 0
    for role in agents:
        for path in spool_files(Path(role.env["PEER_AGENT_HOME"]) / "spool"):
            _, summary = spool_read(path)
            count = stored.filter(session_id=summary.session_id).count()
            acked, pending = acked + summary.acked_reports, pending + len(summary.pending)
            if count != summary.acked_reports or summary.pending or summary.dropped_reports:
                problems.append(f"session {summary.session_id}: {count} stored, {summary.acked_reports} acked, "
                                f"{len(summary.pending)} pending, {summary.dropped_reports} refused")
    print(f"\nreports: {totals['reports']} stored ({totals['samples'] or 0} samples), {acked} acknowledged, "
          f"{pending} pending; {'every report counted exactly once' if not problems else 'MISMATCH: ' + '; '.join(problems)}")
    print(f"memory samples: {samples_path}")
    if problems or any(codes.values()) or lingering:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
