"""A rehearsal of a real-size run: the `large` preset (sahajBERT's settings) trained by volunteers' agents on
volunteers' links in the project's network lab, with the portal's every process, for ``--minutes``.

The demo's portal (bench/demo_lab.py: SQLite, Celery's broker in files, a fresh var dir) with a run made from
the preset: its data a hub source read offline (``HF_DATASETS_OFFLINE``) from a local folder laid out as the
Hub lays a dataset (harness/hub_folder.py), generated Bengali and English text with enough rare words for the
preset's 32,000-piece tokenizer, trained as the portal trains one. Only what a 2-core machine cannot carry is
scaled down, each printed: the target batch and the sequence length (and a checkpoint every few minutes
instead of every 30, so that a short run saves some). In network namespaces (harness/netlab.py, addresses
libp2p takes for public): host 0 the portal's host (web server, first backbone peer), host 1 the second
backbone peer, then the aggregators (an organizer's `peer-agent aggregate`, 100 Mbit/s), then one host per
agent (`peer-agent join`, through the real token flow), each shaped at its ``--rates`` both ways, those in
``--nat`` behind a NAT of their own; ``--late`` joins ``--late-after`` minutes after the others. The Celery
worker, the evaluator and the validator workers run outside the lab (they reach no peer). The coordinators
only schedule spot checks (SPOT_CHECK_WORKERS); the validator workers change at each phase of ``--validators``
(``1 2``: one worker for the first half, two for the second), for the validator lag of each.

Printed: rounds completed, seconds per round (an agent's optimizer step: gradient all-reduce and LAMB step)
and per epoch, the late joiner's state download, checkpoints (size, seconds from due to saved), evaluations,
validator lag per phase, confirmed against reported credit per agent, the holder's log lines, the peak memory
of each process (its own high-water mark, and its process tree's resident set), the load; then a ``SUMMARY``
line of ``name=value`` figures. Every process started is stopped and reaped, and the namespaces removed, also
on Ctrl-C or an error. Needs root, iproute2 and iptables. Run ``python -m bench.rehearsal --help``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tokenizers import Tokenizer

from bench.demo_lab import (
    demo_lab,
    group_kill,
    group_members,
    percentile,
    process_start,
    process_stop,
    seconds,
    services_stop,
    uptime,
)
from bench.rehearsal_figures import (
    agent_log,
    checkpoint_saves,
    commitments_by_phase,
    credit_by_agent,
    holder_counts,
)
from harness.hub_folder import hub_folder_write
from harness.netlab import PUBLIC_SUBNET, NetLab

HUB_CONFIG = "20231101.bn"  # the configuration of the folder, named as wikimedia/wikipedia names Bengali's
AGGREGATOR_MBPS = 100  # an organizer's server (COORDINATOR_AGGREGATOR_BANDWIDTH_MBPS's default)
# What each size changes of its preset's run, and how much text it generates. ``large``: sahajBERT's settings
# but for a target batch of 64 (4,096) and sequences of 128 tokens (512): four agents of one torch thread on two
# cores compute about 0.4 samples/s of ALBERT-large, so 4,096 would be one epoch in three hours, and 512 tokens
# quadruple each step and its activations (the agents, at ~4.5 GB each, fill the machine as it is); a
# checkpoint every 5 minutes instead of 30. ``demo``: the demo's own model and training (runs/management/
# commands/demo.py) on the same kind of data, for the test that runs this bench (tests/bench/).
SIZES = {
    "large": dict(target_batch_size=64, max_seq_length=128, checkpoint_every_minutes=5.0, checkpoint_every_epochs=None,
                  documents=30000, rare_words=60000),
    "demo": dict(target_batch_size=None, max_seq_length=None, checkpoint_every_minutes=None, checkpoint_every_epochs=15,
                 documents=3000, rare_words=0),
}
SAMPLE_EVERY_S = 5.0  # memory and load
PEAK_FIELD = "VmHWM:"  # /proc/<pid>/status: the process's peak resident set


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.rehearsal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(SIZES), default="large", help="the run's size (demo: the CI form)")
    parser.add_argument("--minutes", type=float, default=22.0, help="how long the agents train")
    parser.add_argument("--agents", type=int, default=4, choices=range(1, 5), help="volunteers' agents (the demo's 4 at most)")
    parser.add_argument("--rates", default="50,20,20,10", help="each agent's link in Mbit/s, both ways, comma-separated")
    parser.add_argument("--nat", default="2,3", help="agents behind a NAT of their own (indices, comma-separated)")
    parser.add_argument("--late", type=int, default=3, help="the agent that joins late (-1: none)")
    parser.add_argument("--late-after", type=float, default=None, help="minutes after the others (default a third of the run)")
    parser.add_argument("--aggregators", type=int, default=1, choices=range(0, 3))
    parser.add_argument("--backbones", type=int, default=2, choices=(1, 2), help="coordinators, each a backbone peer")
    parser.add_argument("--validators", type=int, nargs="+", default=[1, 2],
                        help="validator workers in each phase of the run, the phases equally long")
    parser.add_argument("--target-batch-size", type=int, default=None, help="overrides the size's")
    parser.add_argument("--max-seq-length", type=int, default=None, help="overrides the size's")
    parser.add_argument("--drain", type=float, default=300.0,
                        help="seconds the portal goes on checking queued spot checks after the agents stop")
    parser.add_argument("--port", type=int, default=8031)
    parser.add_argument("--prefix", default="rh", help="the lab's namespace prefix")
    parser.add_argument("--var-dir", default=None, help="where the portal keeps its files (default: a fresh temp dir)")
    args = parser.parse_args(argv)
    args.rates = [float(rate) for rate in args.rates.split(",")]
    args.nat = [int(index) for index in args.nat.split(",") if index]
    if len(args.rates) < args.agents or any(not 0 <= index < args.agents for index in args.nat):
        parser.error(f"--rates needs a rate for each of the {args.agents} agents, and --nat indices below it")
    if args.late >= args.agents or min(args.validators) < 0:
        parser.error("--late names an agent (or -1); --validators counts workers")
    return args


def corpus_documents(count: int, rare_words: int, seed: int = 0) -> list[str]:
    """``count`` documents of the generated corpus (runs/setup/corpus.py), each with a line of words drawn from
    ``rare_words`` made-up Bengali words (Zipf-distributed, as names and rare words are in Wikipedia): the
    corpus alone has a few hundred distinct words, far from the 32,000 pieces sahajBERT's tokenizer has."""
    from runs.setup.corpus import corpus_write  # Django is set up by then (demo_lab)

    with tempfile.NamedTemporaryFile(suffix=".txt") as file:
        text = corpus_write(file.name, n_lines=count * 11 // 2, seed=seed).read_text(encoding="utf-8")
    documents = [document.strip() for document in text.split("\n\n") if document.strip()][:count]
    if not rare_words:
        return documents
    rng = random.Random(seed)
    consonants = [chr(code) for code in range(0x995, 0x9B9 + 1) if chr(code) not in "\u09a9\u09b1\u09b3\u09b4\u09b5"]
    vowels = ["", "\u09be", "\u09bf", "\u09c0", "\u09c1", "\u09c2", "\u09c7", "\u09cb"]
    words = list({"".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))
                  for _ in range(rare_words)})
    weights = [1 / (rank + 10) for rank in range(len(words))]
    return [f"{document}\n{' '.join(rng.choices(words, weights, k=8))}।" for document in documents]


def rehearsal_run_ensure(*, organizer, preset: str, size: dict, folder: Path):
    """The rehearsal's run: the preset's configuration with the size's changes and the hub source in ``folder``,
    its sources checked and its tokenizer trained as the portal's worker does both, active."""
    # Django is set up by then (demo_lab)
    from peer_agent.protocol import RunConfig
    from runs.management.commands.demo import demo_config
    from runs.models import ModelLicense, Run
    from runs.setup import services
    from runs.setup.forms import preset_config

    slug = f"rehearsal-{preset}"
    run = Run.objects.filter(slug=slug).first()
    if run is not None:
        return run
    data = (demo_config("demo") if preset == "demo" else preset_config(preset)).model_dump(mode="json")
    data["data"].update(source="hub", hub=[dict(path=str(folder), name=HUB_CONFIG, split="train", text_column="text",
                                                probability=1.0)], heldout="hash")
    if size["max_seq_length"]:
        data["data"]["max_seq_length"] = size["max_seq_length"]
    if size["target_batch_size"]:
        data["training"]["target_batch_size"] = size["target_batch_size"]
    data["averaging"].update(checkpoint_every_minutes=size["checkpoint_every_minutes"],
                             checkpoint_every_epochs=size["checkpoint_every_epochs"])
    run = services.run_create(organizer=organizer, name=f"Rehearsal ({preset})", slug=slug, visibility=Run.Visibility.PUBLIC,
                              description="bench/rehearsal.py", config=RunConfig.model_validate(data),
                              card={"license": ModelLicense.APACHE, "languages": ["bn", "en"]})
    services.sources_check(run_id=run.pk)
    started = time.monotonic()
    services.tokenizer_train(run_id=run.pk)
    run.refresh_from_db()
    print(f"tokenizer trained in {time.monotonic() - started:.0f} s", flush=True)
    services.run_transition(run=run, actor=organizer, action="activate")
    return run


@dataclass
class Started:
    """A process the rehearsal started: its name, Popen, log, and memory peaks seen while it ran."""

    name: str
    process: subprocess.Popen
    log: Path
    peak_own: int = 0  # bytes: the process's own high-water mark (VmHWM)
    peak_tree: int = 0  # bytes: the largest sum of its tree's resident sets sampled
    stopped: bool = False
    exit: int | None = None
    died: int | None = None  # its exit status, when it ended before the rehearsal stopped it (-9: out of memory?)


@dataclass
class Rehearsal:
    args: argparse.Namespace
    lab: object  # bench.demo_lab.DemoLab
    net: NetLab
    url: str
    backbone_hosts: int
    agent_host: int  # the lab's host of the first agent
    started: list[Started] = field(default_factory=list)
    phases: list[tuple[float, float, int]] = field(default_factory=list)  # (from, to, validator workers), POSIX time
    training_started: float | None = None  # POSIX time
    load_max: float = 0.0
    _sampling: threading.Event = field(default_factory=threading.Event)

    def start(self, name: str, command: list[str], env: dict, *, host: int | None = None, oom_score: int = 0) -> Started:
        log = self.lab.logs / f"{name}.log"
        command = self.net.command(host, *command) if host is not None else command
        process = process_start(command, env, log)
        if oom_score:  # before it forks hivemind's processes, which inherit it
            Path(f"/proc/{process.pid}/oom_score_adj").write_text(str(oom_score))
        self.started.append(Started(name, process, log))
        return self.started[-1]

    def sample(self) -> None:
        """Every SAMPLE_EVERY_S: each running process's peak resident set, its tree's, and the load."""
        while not self._sampling.wait(SAMPLE_EVERY_S):
            self.load_max = max(self.load_max, os.getloadavg()[0])
            for each in self.started:
                if each.stopped:
                    continue
                try:
                    root = psutil.Process(each.process.pid)
                    tree = [root, *root.children(recursive=True)]
                    each.peak_tree = max(each.peak_tree, sum(_rss(member) for member in tree))
                    each.peak_own = max(each.peak_own, _peak(each.process.pid))
                except psutil.Error:
                    continue

    def stop(self, names: list[str], *, ask=signal.SIGINT, within: float = 60.0) -> None:
        """Ask the named processes' groups to stop together, wait ``within``, and kill what is left of each."""
        chosen = [each for each in self.started if each.name in names and not each.stopped]
        for each in chosen:
            if each.process.poll() is None:
                try:
                    os.killpg(each.process.pid, ask)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + within
        for each in chosen:
            try:
                each.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            group_kill(each.process.pid, grace=max(0.0, deadline - time.monotonic()))
            each.process.wait()
            each.stopped, each.exit = True, each.process.returncode


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def _peak(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(PEAK_FIELD):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if os.geteuid() != 0:
        raise SystemExit("the network lab (harness/netlab.py) needs root, iproute2 and iptables")
    size = dict(SIZES[args.preset])
    size.update({key: value for key in ("target_batch_size", "max_seq_length") if (value := getattr(args, key))})
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM cleans up as Ctrl-C does
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # every process reads the hub source from the local folder, nothing else
    var = Path(args.var_dir or tempfile.mkdtemp(prefix="dedloc-rehearsal-"))
    var.mkdir(parents=True, exist_ok=True)
    var.chmod(0o755)
    folder = var / "hub" / "wikipedia-like"
    made = time.monotonic()
    lab = demo_lab(var_dir=str(var), prefix="dedloc-rehearsal-", volunteers=args.agents, port=args.port,
                   run_ensure=functools.partial(_run_with_data, preset=args.preset, size=size, folder=folder))
    run = lab.run
    config = run.configuration
    print(f"var dir {var}; run {run.slug} ({args.preset}): vocabulary {_vocabulary(run)}, target batch "
          f"{config.training.target_batch_size}, {config.training.per_device_batch_size} per step, sequences of "
          f"{config.data.max_seq_length} tokens, {config.training.optimizer}, averaging in "
          f"{config.averaging.grad_compression}, checkpoints every {config.averaging.checkpoint_every_minutes} min / "
          f"{config.averaging.checkpoint_every_epochs} epochs; set up in {time.monotonic() - made:.0f} s; "
          f"uptime: {uptime()}", flush=True)
    rehearsal = _lab_start(args, lab)
    try:
        _train(rehearsal)
    finally:
        # The clean-up runs to its end: a second Ctrl-C must not leave processes or namespaces behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = _teardown(rehearsal)
    _report(rehearsal, left)


def _run_with_data(*, organizer, preset: str, size: dict, folder: Path):
    if not (folder / "README.md").exists():
        documents = corpus_documents(size["documents"], size["rare_words"])
        hub_folder_write(folder, {HUB_CONFIG: {"train": documents}}, shards=4)
    return rehearsal_run_ensure(organizer=organizer, preset=preset, size=size, folder=folder)


def _vocabulary(run) -> int:
    return Tokenizer.from_file(run.tokenizer_file.path).get_vocab_size()


def _lab_start(args: argparse.Namespace, lab) -> Rehearsal:
    """The lab's namespaces, then the portal's processes in them, waiting for each backbone peer's heartbeat."""
    backbone_hosts = max(1, args.backbones)
    rates = [None] * backbone_hosts + [AGGREGATOR_MBPS] * args.aggregators + args.rates[:args.agents]
    agent_host = backbone_hosts + args.aggregators
    net = NetLab(len(rates), rates, prefix=args.prefix, subnet=PUBLIC_SUBNET,
                 nat=[agent_host + index for index in args.nat])
    net.up()
    url = f"http://{net.address(0)}:{args.port}"
    os.environ.update(ALLOWED_HOSTS=f"{net.address(0)},127.0.0.1,localhost", SITE_URL=url)
    return Rehearsal(args=args, lab=lab, net=net, url=url, backbone_hosts=backbone_hosts, agent_host=agent_host)


def _train(rehearsal: Rehearsal) -> None:
    # Django is set up by then (demo_lab)
    from django.utils import timezone

    from accounts.services import token_create
    from runs.management.commands.demo import (
        agent_launch,
        coordinator_command,
        evaluator_command,
        validator_command,
        web_command,
        worker_command,
    )
    from runs.models import Backbone

    args, lab, net, run = rehearsal.args, rehearsal.lab, rehearsal.net, rehearsal.lab.run
    threading.Thread(target=rehearsal.sample, daemon=True, name="sampler").start()
    launched = timezone.now()
    rehearsal.start("web", web_command("0.0.0.0", args.port), {}, host=0)
    rehearsal.start("worker", worker_command(), {})
    rehearsal.start("evaluator", evaluator_command(), {})
    for number in range(args.backbones):
        # Each after the one before is up: the second bootstraps from the first's addresses (run.initial_peers).
        rehearsal.start(f"coordinator{number}", coordinator_command(), {
            "COORDINATOR_HOST_MADDRS": f"/ip4/{net.address(number)}/tcp/0", "SPOT_CHECK_WORKERS": "1",
            "COORDINATOR_STATE_DIR": str(lab.var_dir / f"backbone{number}")}, host=number)
        _wait(lambda count=number + 1: Backbone.objects.filter(run=run, heartbeat_at__gt=launched).count() >= count,
              300, f"backbone peer {number}", rehearsal)
    print(f"{_clock(rehearsal)} portal and {args.backbones} backbone peer(s) up at {rehearsal.url}; uptime: {uptime()}",
          flush=True)

    validators: list[str] = []

    def validators_set(count: int) -> None:
        while len(validators) < count:
            name = f"validator{len(validators)}"
            rehearsal.start(name, validator_command(name=name, loglevel="INFO"), {"OMP_NUM_THREADS": "1",
                                                                                     "MKL_NUM_THREADS": "1"})
            validators.append(name)
        if len(validators) > count:
            rehearsal.stop(validators[count:], ask=signal.SIGTERM)
            del validators[count:]

    validators_set(args.validators[0])
    home = lab.var_dir / "agents"
    verbose = ["--log-format", "json", "--verbose"]
    for number in range(args.aggregators):
        _, secret = token_create(user=lab.organizer, name=f"rehearsal aggregator {number}")
        host = rehearsal.backbone_hosts + number
        rehearsal.start(f"aggregator{number}", [
            sys.executable, "-m", "peer_agent", "aggregate", "--portal", rehearsal.url, run.slug,
            "--bandwidth-mbps", str(AGGREGATOR_MBPS), *verbose], {
            "PEER_AGENT_TOKEN": secret, "PEER_AGENT_HOME": str(home / f"aggregator{number}"), "PEER_AGENT_THREADS": "1",
            "PEER_AGENT_HOST": f"/ip4/{net.address(host)}/tcp/0", "PEER_AGENT_CLIENT_MODE": "off"}, host=host)

    def agent_start(index: int) -> None:
        volunteer, host = lab.volunteers[index], rehearsal.agent_host + index
        command, env = agent_launch(volunteer, rehearsal.url, home / volunteer.username, slug=run.slug)
        # Volunteers' settings: the agent decides its client mode by a dial-back, as a volunteer's does.
        env.update(PEER_AGENT_HOST=f"/ip4/{net.inner_address(host)}/tcp/0", PEER_AGENT_CLIENT_MODE="auto")
        behind = " behind NAT" if host in net.nat else ""
        print(f"{_clock(rehearsal)} agent {index} ({volunteer.username}) joins at {args.rates[index]:g} Mbit/s{behind}",
              flush=True)
        # An OOM kill, if memory runs out, then takes an agent, as on a volunteer's machine, not the portal.
        rehearsal.start(f"agent{index}-{volunteer.username}", command + verbose, env, host=host, oom_score=1000)

    rehearsal.training_started = time.time()
    for index in range(args.agents):
        if index != args.late:
            agent_start(index)
    late_at = (args.late_after if args.late_after is not None else args.minutes / 3) * 60
    phase_seconds = args.minutes * 60 / len(args.validators)
    begun, late_started, phase = time.monotonic(), args.late < 0, 0
    phase_start = time.time()
    while (elapsed := time.monotonic() - begun) < args.minutes * 60:
        if not late_started and elapsed >= late_at:
            agent_start(args.late)
            late_started = True
        if elapsed >= (phase + 1) * phase_seconds and phase + 1 < len(args.validators):
            rehearsal.phases.append((phase_start, time.time(), args.validators[phase]))
            phase, phase_start = phase + 1, time.time()
            print(f"{_clock(rehearsal)} validator workers: {args.validators[phase]}; uptime: {uptime()}", flush=True)
            validators_set(args.validators[phase])
        for each in rehearsal.started:
            if not each.stopped and each.process.poll() is not None and each.died is None:
                each.died = each.process.returncode
                # Its DHT, averagers and p2p daemon outlive it (an OOM kill takes the one process): they would go on
                # holding memory, and declaring the run's state to the holder, as a dead peer's should not.
                orphans = len(group_members(each.process.pid))
                group_kill(each.process.pid, grace=0)
                print(f"{_clock(rehearsal)} {each.name} exited with {each.process.returncode}"
                      f"{' (SIGKILL: out of memory?)' if each.process.returncode == -signal.SIGKILL else ''}; "
                      f"{orphans} processes of its group killed", flush=True)
        time.sleep(2)
    rehearsal.training_ended = time.time()
    rehearsal.phases.append((phase_start, float("inf"), args.validators[phase]))
    print(f"{_clock(rehearsal)} the agents stop; uptime: {uptime()}", flush=True)
    trainers = [each.name for each in rehearsal.started if each.name.startswith(("agent", "aggregator"))]
    rehearsal.stop(trainers, within=60)
    _drain(rehearsal)


def _drain(rehearsal: Rehearsal) -> None:
    """Let the portal record the spot checks queued before the agents stopped (a live portal would)."""
    from runs.models import StepCommitment  # Django is set up by then (demo_lab)

    queued = StepCommitment.objects.filter(session__run=rehearsal.lab.run, outcome=StepCommitment.Outcome.PENDING,
                                           queued_at__isnull=False)
    deadline = time.monotonic() + rehearsal.args.drain
    while queued.exists() and time.monotonic() < deadline:
        time.sleep(2)
    print(f"{_clock(rehearsal)} queued spot checks still unrecorded: {queued.count()}", flush=True)


def _teardown(rehearsal: Rehearsal) -> int:
    """Stop every process (trainers first, then the portal's), reap what is left, remove the namespaces; returns
    how many processes of the rehearsal's groups are still alive."""
    rehearsal._sampling.set()
    try:
        rehearsal.stop([each.name for each in rehearsal.started if each.name.startswith(("agent", "aggregator"))],
                       within=60)
        services_stop([each.process for each in rehearsal.started if not each.stopped])
        for each in rehearsal.started:
            each.stopped, each.exit = True, each.process.returncode
        for each in rehearsal.started:  # the groups of processes whose leader was gone before the stop
            process_stop(each.process, timeout=1)
    finally:
        from harness.processes import children_reap  # hivemind (and torch) load only now, for the reaping

        children_reap()
        rehearsal.net.down()
    return sum(len(group_members(each.process.pid)) for each in rehearsal.started)


def _wait(ready, timeout: float, what: str, rehearsal: Rehearsal) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start within {timeout:.0f} s: see the logs in {rehearsal.lab.logs}")
        time.sleep(1)


def _clock(rehearsal: Rehearsal) -> str:
    started = rehearsal.training_started
    return f"{time.time() - started:7.0f} s" if started else "  setup  "


def _report(rehearsal: Rehearsal, left: int) -> None:
    from runs.models import Checkpoint, Evaluation  # Django is set up by then (demo_lab)

    args, lab, run = rehearsal.args, rehearsal.lab, rehearsal.lab.run
    logs = {each.name: agent_log(each.log) for each in rehearsal.started if each.name.startswith("agent")}
    rounds = [duration for log in logs.values() for duration in log.rounds.values()]
    entered = dict(sorted({epoch: min(log.epochs_entered[epoch] for log in logs.values() if epoch in log.epochs_entered)
                           for log in logs.values() for epoch in log.epochs_entered}.items()))
    # An epoch of the swarm: one whose closing round averaged two peers or more (a lone agent's epochs take a step each).
    epochs_averaged = {epoch for log in logs.values() for epoch in log.rounds}
    gaps = [entered[epoch + 1] - entered[epoch] for epoch in sorted(epochs_averaged)
            if epoch in entered and epoch + 1 in entered]
    averaged = sum(sum(count for group, count in log.averaged.items() if group > 1) for log in logs.values())
    late = next((log for name, log in logs.items() if name.startswith(f"agent{args.late}-")), None)
    late_state = late.state_downloads[0] if late and late.state_downloads else None
    checkpoints = list(Checkpoint.objects.filter(run=run, epoch__gt=0).values_list("epoch", "size"))
    coordinator_logs = [each.log for each in rehearsal.started if each.name.startswith("coordinator")]
    saves = checkpoint_saves(coordinator_logs)
    evaluations = list(Evaluation.objects.filter(run=run, epoch__isnull=False).values_list("epoch", "wall_seconds",
                                                                                           "cpu_seconds", "error"))
    phases = commitments_by_phase(run, rehearsal.phases)
    credit = credit_by_agent(run, lab.volunteers[:args.agents])

    print(f"\nran {args.minutes:g} min of training; uptime: {uptime()}; highest 1-minute load {rehearsal.load_max:.1f}")
    print(f"epochs entered: {min(entered, default='-')} to {max(entered, default='-')}, {len(epochs_averaged)} of them "
          f"closed by a round of two peers or more; s/epoch of those median {seconds(percentile(gaps, 50))} "
          f"(min {seconds(min(gaps, default=None))}, max {seconds(max(gaps, default=None))}, of {len(gaps)}); an agent's "
          f"optimizer step with a round (s/round) median {seconds(percentile(rounds, 50))} s, max "
          f"{seconds(max(rounds, default=None))} s, of {len(rounds)}; gradient rounds averaged {averaged} (each agent's "
          f"count), failed {sum(log.failed_rounds for log in logs.values())}, steps alone "
          f"{sum(log.alone for log in logs.values())}")
    for name, log in logs.items():
        downloads = ", ".join(f"{duration:.1f} s ({size / 1e6:.0f} MB)" for duration, size in log.state_downloads)
        print(f"  {name:<18} epochs {min(log.epochs_entered, default='-')}-{max(log.epochs_entered, default='-')}, "
              f"groups {dict(sorted(log.averaged.items()))}, failed rounds {log.failed_rounds}, alone {log.alone}, "
              f"state downloads: {downloads or 'none'}; caught up {[round(each, 1) for each in log.catch_ups]} s after")
    print(f"late joiner (agent {args.late}): state {seconds(late_state[0]) if late_state else 'none'} s"
          f"{f' for {late_state[1] / 1e6:.0f} MB' if late_state else ''}, then {len(late.catch_ups) if late else 0} "
          f"catch-ups to the swarm's epoch, {len(late.state_downloads) - 1 if late and late.state_downloads else 0} more "
          "downloads")
    print(f"checkpoints: {[(epoch, round(size / 1e6, 1)) for epoch, size in checkpoints]} (epoch, MB); due to saved "
          f"{[round(save, 1) for save in saves]} s")
    print(f"evaluations: {[(epoch, round(wall, 1), round(cpu, 1), error[:60]) for epoch, wall, cpu, error in evaluations]}"
          " (epoch, wall s, CPU s, error)")
    for phase in phases:
        print(f"validators {phase['workers']}: commitments {phase['due']}, queued {phase['queued']}, recorded "
              f"{phase['recorded']} {phase['outcomes']}; lag arrival to record p50 {seconds(percentile(phase['lag'], 50))} "
              f"max {seconds(max(phase['lag'], default=None))} s; arrival to queued p50 "
              f"{seconds(percentile(phase['waited'], 50))} s; queued to record p50 {seconds(percentile(phase['worked'], 50))}"
              f" max {seconds(max(phase['worked'], default=None))} s")
    for row in credit:
        print(f"  {row['user']:<8} reported {row['reported']:>6} confirmed {row['confirmed']:>6} epochs {row['epochs']} "
              f"commitments {row['commitments']}")
    print(f"holder and validator lines in the coordinators' logs: {dict(holder_counts(coordinator_logs))}")
    print("peak memory (own high-water mark / process tree's resident sets, MB) and exit status:")
    for each in rehearsal.started:
        print(f"  {each.name:<22} {each.peak_own / 1e6:8.0f} {each.peak_tree / 1e6:8.0f}  exit {each.exit}")
    namespaces = rehearsal.net.namespaces()
    figures = dict(
        epochs=len(entered), epochs_averaged=len(epochs_averaged), rounds=averaged,
        s_per_epoch=seconds(percentile(gaps, 50)), s_per_round=seconds(percentile(rounds, 50)),
        late_state_s=seconds(late_state[0]) if late_state else "none",
        late_downloads=len(late.state_downloads) if late else 0, late_catch_ups=len(late.catch_ups) if late else 0,
        checkpoints=len(checkpoints), checkpoint_mb=f"{max((size for _, size in checkpoints), default=0) / 1e6:.1f}",
        checkpoint_save_s=seconds(max(saves, default=None)),
        evaluation_s=seconds(max((wall for _, wall, _, error in evaluations if not error), default=None)),
        **{f"lag_{phase['workers']}w": f"{seconds(percentile(phase['lag'], 50))}/{seconds(max(phase['lag'], default=None))}"
           for phase in phases},
        **{f"recorded_{phase['workers']}w": f"{phase['recorded']}/{phase['due']}" for phase in phases},
        confirmed=sum(row["confirmed"] for row in credit), reported=sum(row["reported"] for row in credit),
        oom_killed=sum(each.died == -signal.SIGKILL for each in rehearsal.started),
        processes_left=left, namespaces_left=len(namespaces), load_max=f"{rehearsal.load_max:.1f}")
    print("SUMMARY " + " ".join(f"{name}={value}" for name, value in figures.items()), flush=True)


if __name__ == "__main__":
    main()
