"""Liars: the return per computed example of each cheating strategy of issue 29, against honest agents, in one run.

The same processes as ``manage.py demo`` (web server, Celery worker with beat, coordinator, two honest
peer agents through the real CLI and token flow) on a fresh var directory (SQLite unless DATABASE_URL is
set). Beside the honest agents, one liar at a time joins as a volunteer of its own for ``--seconds``: the
real agent with parts of its ``Trainer`` swapped (tests/security/liar_agent.py, tests/e2e/lazy_agent.py),
playing one strategy (docs/trust.md, "The economics of lying"), or, as the control, a third honest agent
(``honest``): what a third peer alone costs the two honest agents on these cores. Each strategy below names
the parts its liar swaps; the rest of its agent is the honest one's. Between two liars, and after the last,
the honest agents train on for ``--drain`` seconds, so that the liar's last epochs are judged.

Each liar writes the samples it really computed; an honest agent computed what it reported. The return
is the confirmed samples per computed example; the baseline is the honest agents' own, the same run.
Honest coverage is the share of the honest agents' judged epochs rejected or flagged after the first
``--warmup-epochs``, over the whole run, while each liar trained and in the drain after it.

Run ``python -m bench.liar --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path

from bench.demo_lab import demo_lab, process_start, process_stop, services_stop, uptime

# name -> (the agent's module, its environment): one row of docs/trust.md's economics each
STRATEGIES = {
    # the control: a third honest volunteer, the same load on the machine and the swarm as a liar's, no lie
    "honest": ("peer_agent", {}),
    # the step computer (LazySteps): fakes nine steps in ten, claimed at the swarm's state
    "lazy": ("tests.e2e.lazy_agent", {}),
    # the step computer (LiarSteps): fakes steps claimed at parameters 5% off the swarm's
    "shield": ("tests.security.liar_agent", {"LIAR_STRATEGIES": "shield", "LIAR_CAPTURE": "off"}),
    # the step computer fakes every step, and the commitments (LiarCommitments) come after the deadline
    "dark": ("tests.security.liar_agent", {"LIAR_STRATEGIES": "dark", "LIAR_CAPTURE": "off"}),
    # the commitments: each epoch's sent again with a cursor that would stall the validator
    "stall": ("tests.security.liar_agent", {"LIAR_STRATEGIES": "stall", "LIAR_CAPTURE": "off"}),
    # hivemind's state averager (CapturingStateAverager): serves parameters 5% off, first in line
    "capture": ("tests.security.liar_agent", {"LIAR_STRATEGIES": "probe", "LIAR_CAPTURE": "on"}),
    "mix": ("tests.security.liar_agent", {"LIAR_STRATEGIES": "probe,shield,dark,stall", "LIAR_CAPTURE": "on"}),
}


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.liar", description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"the liars, one after another (of {', '.join(STRATEGIES)})")
    parser.add_argument("--seconds", type=float, default=150.0, help="how long each liar trains")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds the honest agents go on after each liar")
    parser.add_argument("--warmup-epochs", type=int, default=12, help="honest epochs left out of the coverage")
    parser.add_argument("--port", type=int, default=8019)
    parser.add_argument("--judge-wait", type=float, default=60.0,
                        help="seconds the portal goes on judging after the agents stop (a live portal would)")
    parser.add_argument("--agents-verbose", action="store_true",
                        help="agents log hivemind's rounds too (every agent logs one JSON object a line, kept in --var-dir)")
    parser.add_argument("--var-dir", default=None, help="where the portal keeps its files (default: a fresh temp dir)")
    args = parser.parse_args()
    unknown = set(args.strategies.split(",")) - set(STRATEGIES)
    if unknown:
        parser.error(f"unknown strategies: {', '.join(sorted(unknown))}")
    return args


def main() -> None:
    args = _parse()
    lab = demo_lab(var_dir=args.var_dir, prefix="dedloc-liar-", volunteers=2, port=args.port)
    var_dir, logs, url, run, honest = lab.var_dir, lab.logs, lab.url, lab.run, lab.volunteers
    from django.db.models import Sum
    from django.utils import timezone

    from accounts.models import User
    from runs.management.commands.demo import agent_launch, backbone_wait
    from runs.models import ContributionEvent, RunSample, SessionEpoch, epoch_confirmed_samples

    print(f"var dir {var_dir}; liars {args.strategies}, {args.seconds:g} s each, {args.drain:g} s drain; "
          f"uptime: {uptime()}", flush=True)
    launched = timezone.now()
    services = [process_start(command, {}, log) for _, command, log in lab.services]
    agents = []
    # strategy -> the liar, its home, and the swarm's epochs as it joined, left, and the drain after it ended
    liars: dict[str, tuple[User, Path, str, tuple[int, int, int]]] = {}

    def swarm_epoch() -> int:
        return RunSample.objects.filter(run=run).order_by("-at").values_list("global_epoch", flat=True).first() or 0

    # JSON logs, one line a record, whatever the verbosity: the console format wraps a message across lines,
    # and the counts below read the messages' texts.
    verbose = ["--log-format", "json", *(["--verbose"] if args.agents_verbose else [])]
    started = time.monotonic()
    try:
        backbone_wait(run, since=launched)
        for volunteer in honest:
            command, env = agent_launch(volunteer, url, var_dir / "agents" / volunteer.username)
            command += verbose
            agents.append(process_start(command, env, logs / f"{volunteer.username}.log"))
        for strategy in args.strategies.split(","):
            module, strategy_env = STRATEGIES[strategy]
            name = "third-honest" if module == "peer_agent" else f"liar-{strategy}"
            liar = User.objects.create_user(username=name, email=f"{name}@demo.invalid",
                                            email_verified_at=timezone.now())
            home = var_dir / "agents" / liar.username
            command, env = agent_launch(liar, url, home)
            command += verbose
            command[command.index("peer_agent")] = module
            print(f"{time.monotonic() - started:6.0f} s  {liar.username} joins", flush=True)
            joined = swarm_epoch()
            process = process_start(command, {**env, **strategy_env}, logs / f"{liar.username}.log")
            time.sleep(args.seconds)
            process_stop(process)
            left = swarm_epoch()
            print(f"{time.monotonic() - started:6.0f} s  {liar.username} left (exit {process.returncode}); "
                  f"the honest agents train on {args.drain:g} s", flush=True)
            time.sleep(args.drain)
            liars[strategy] = (liar, home, module, (joined, left, swarm_epoch()))
    finally:
        for process in agents:
            process_stop(process)
        try:
            # The monitor judges an epoch some seconds after it closes; the agents' last epochs would otherwise count
            # as unconfirmed credit that a portal left running confirms.
            deadline = time.monotonic() + args.judge_wait
            while time.monotonic() < deadline and SessionEpoch.objects.filter(
                    session__run=run, status=SessionEpoch.Status.PROVISIONAL).exists():
                time.sleep(2)
            unjudged = SessionEpoch.objects.filter(session__run=run, status=SessionEpoch.Status.PROVISIONAL).count()
            print(f"epochs still provisional {args.judge_wait:g} s after the agents stopped, at most: {unjudged}")
        finally:
            services_stop(services)

    def standing(user: User) -> tuple[int, int, Counter]:
        """Confirmed samples, samples reported, and how many epochs have each status."""
        rows = list(SessionEpoch.objects.filter(session__user=user).values_list("status", "reported_samples",
                                                                                  "announced_samples"))
        confirmed = sum(epoch_confirmed_samples(status=status, reported=reported, announced=announced)
                        for status, reported, announced in rows)
        reported = ContributionEvent.objects.filter(session__user=user).aggregate(total=Sum("samples"))["total"] or 0
        return confirmed, reported, Counter(status for status, _, _ in rows)

    print(f"\nran {(time.monotonic() - started) / 60:.1f} min; uptime: {uptime()}")
    print(f"{'who':<16} {'computed':>9} {'reported':>9} {'confirmed':>9} {'return':>7} {'/honest':>8}  epochs")
    baseline_confirmed = baseline_computed = 0
    for volunteer in honest:
        confirmed, reported, statuses = standing(volunteer)
        baseline_confirmed, baseline_computed = baseline_confirmed + confirmed, baseline_computed + reported
        print(f"{volunteer.username:<16} {reported:>9} {reported:>9} {confirmed:>9} {confirmed / max(reported, 1):7.3f} "
              f"{'':>8}  {dict(sorted(statuses.items()))}")
    baseline = baseline_confirmed / max(baseline_computed, 1)
    for liar, home, module, _ in liars.values():
        confirmed, reported, statuses = standing(liar)
        computed_file = home / "computed"
        if module == "peer_agent":  # the honest control computed what it reported
            computed = reported
        else:
            computed = int(computed_file.read_text()) if computed_file.exists() else 0
        ratio = confirmed / max(computed, 1)
        print(f"{liar.username:<16} {computed:>9} {reported:>9} {confirmed:>9} {ratio:7.3f} {ratio / baseline:8.2f}  "
              f"{dict(sorted(statuses.items()))}")

    def logged(user: User, text: str) -> int:
        path = logs / f"{user.username}.log"
        return path.read_text(errors="replace").count(text) if path.exists() else 0

    # A round whose results for some parts came too late leaves the peer its own values there
    # (hivemind/averaging/partition.py): it steps off the others' parameters (docs/benchmarks.md, section 17).
    # A failed parameter averaging leaves the peer its own parameters; an out-of-step peer downloads the swarm's
    # state, and so does one whose gradient round held a later epoch (peer_agent/averaging.py says each).
    print(f"\n{'who':<16} {'partial rounds':>14} {'failed param. rounds':>20} {'state downloads':>15} {'resyncs':>8}")
    for user in [*honest, *(liar for liar, *_ in liars.values())]:
        print(f"{user.username:<16} {logged(user, 'Averaging: received'):>14} "
              f"{logged(user, 'Parameter averaging at epoch'):>20} {logged(user, 'Out of step with the swarm'):>15} "
              f"{logged(user, 'gradient round held peers already'):>8}")

    lost_statuses = (SessionEpoch.Status.REJECTED, SessionEpoch.Status.FLAGGED)

    def honest_lost(first: int, last: int) -> str:
        """The honest agents' judged epochs from ``first`` to ``last``, and how many of them were lost."""
        judged = (SessionEpoch.objects.filter(session__user__in=honest, epoch__gte=first, epoch__lte=last)
                  .exclude(status=SessionEpoch.Status.PROVISIONAL).values_list("status", flat=True))
        lost = sum(status in lost_statuses for status in judged)
        reasons = Counter(re.sub(r"[\d.]+", "N", detail)[:60] for detail in SessionEpoch.objects.filter(
            session__user__in=honest, epoch__gte=first, epoch__lte=last, status__in=lost_statuses)
            .values_list("detail", flat=True))
        return f"{lost} of {len(judged)} ({100 * lost / max(len(judged), 1):.1f}%) {dict(reasons.most_common(3))}"

    print(f"\nhonest agents' epochs rejected or flagged, after the first {args.warmup_epochs}:")
    print(f"{'whole run':<22} {honest_lost(args.warmup_epochs, 2**31)}")
    for strategy, (_, _, _, (joined, left, drained)) in liars.items():
        print(f"{'with ' + strategy:<22} epochs {joined}-{left}: {honest_lost(max(joined, args.warmup_epochs), left)}")
        print(f"{'after ' + strategy:<22} epochs {left + 1}-{drained}: {honest_lost(left + 1, drained)}")


if __name__ == "__main__":
    main()
