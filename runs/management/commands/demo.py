"""`manage.py demo`: the whole platform on embedded defaults, on one machine, in one command.

It prepares a demo organizer, two volunteers in a team and an active run of a small ALBERT on a corpus the
project generates, with downstream probes on labelled sets generated to go with it, then starts the
web server, a Celery worker with beat, workers for evaluations and spot checks, the coordinator and peer
agents that join through the real CLI and token flow. Ctrl-C stops every process it started.
"""

import contextlib
import datetime
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from accounts.models import Team, User
from accounts.services import team_create, team_join, token_create
from peer_agent.join import STOP_WITHIN_S
from peer_agent.protocol import RunConfig
from runs.models import ModelLicense, Probe, Run
from runs.setup import services
from runs.setup.corpus import corpus_lines
from runs.setup.forms import preset_config
from runs.setup.labelled import entity_sets, kind_sets
from runs.setup.probes import probe_add

ORGANIZER = ("organizer", "organizer-demo-pass")
VOLUNTEERS = [("amina", "amina-demo-pass"), ("rahim", "rahim-demo-pass"), ("nusrat", "nusrat-demo-pass"),
              ("tanvir", "tanvir-demo-pass")]
RUN_SLUG = "bengali-demo"
CHECKPOINT_EVERY_EPOCHS = 5  # the first checkpoint appears on the run page within a minute or two of training
# The demo's own model (the default `--preset demo`): half the tiny preset's width on sequences of 64
# tokens, with a batch and a learning rate sized for it, so that on a laptop's CPU it learns words,
# not only how frequent they are, within the demo's first minutes, and its probes' scores pass the
# random-init baseline there. The tiny preset at its own settings learns little more than word
# frequencies in that time (docs/benchmarks.md section 15).
DEMO_MODEL = {"preset": "custom", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 256, "embedding_size": 64, "max_position_embeddings": 64}
# The long warmup is for the spot checks (docs/trust.md): while the agents join, rounds fail and an
# agent steps on its own gradients; at the full rate one such step moves its parameters far enough
# from the swarm's that an honest recomputation measures 0.05-0.25 against the tolerance of 0.1.
# The rate then decays to 0 at epoch 1,000 (about an hour on a laptop): held at 0.06, the model's loss fell to
# 1.9 by epoch 550 and blew up after 600 (2.3 at 606, 11.7 at 708, 5.5 from then on; two demos beside CI
# runs, docs/benchmarks.md section 19), and from then on the agents' parameters drifted apart within every
# epoch, past what a spot check tells apart from a state of their own: 88% of their steps earned nothing.
DEMO_TRAINING = {"target_batch_size": 256, "per_device_batch_size": 32, "learning_rate": 0.06, "warmup_steps": 40,
                 "total_steps": 1000}
# An agent stops within peer_agent.join.STOP_WITHIN_S of Ctrl-C, its last reports sent; the margin is
# for a loaded machine. The portal's own processes stop within seconds of SIGTERM (tests/test_process_stops.py).
AGENT_STOP_SECONDS = STOP_WITHIN_S + 5
PORTAL_STOP_SECONDS = 15


def _person(username: str, password: str) -> User:
    user, _ = User.objects.get_or_create(username=username, defaults={
        "email": f"{username}@demo.invalid", "email_verified_at": timezone.now()})
    user.set_password(password)
    user.save()
    return user


def demo_people_ensure(volunteers: int) -> tuple[User, list[User]]:
    """The demo accounts, with their known passwords; the volunteers share a team."""
    organizer = _person(*ORGANIZER)
    organizer.user_permissions.add(Permission.objects.get(codename="organize_runs"))
    people = [_person(*pair) for pair in VOLUNTEERS[:volunteers]]
    team = (Team.objects.filter(name="Dhaka Compute", disbanded_at=None).first()
            or team_create(founder=people[0], name="Dhaka Compute"))
    for person in people:
        team_join(user=person, team=team)
    return organizer, people


def demo_run_ensure(*, organizer: User, preset: str) -> Run:
    """An active run with data and a trained tokenizer; made once, reused by later demos."""
    run = Run.objects.filter(slug=RUN_SLUG).first()
    if run is None:
        run = services.run_create(
            organizer=organizer, name="Bengali ALBERT (demo)", slug=RUN_SLUG, visibility=Run.Visibility.PUBLIC,
            description="A tiny ALBERT pretrained collaboratively on generated Bengali and English text.",
            config=demo_config(preset), card={"license": ModelLicense.APACHE, "languages": ["bn", "en"]},
        )
        text = "\n".join(corpus_lines(n_lines=20000))
        services.data_file_add(run=run, actor=organizer, name="demo-corpus.txt", content=text.encode())
        services.tokenizer_train(run_id=run.pk)
        run.refresh_from_db()
    demo_probes_ensure(run=run, organizer=organizer)
    if run.status == Run.Status.DRAFT:
        services.run_transition(run=run, actor=organizer, action="activate")
    elif run.status in (Run.Status.PAUSED, Run.Status.FINISHED):
        Run.objects.filter(pk=run.pk).update(status=Run.Status.ACTIVE)
    return run


def demo_config(preset: str) -> RunConfig:
    """The demo run's configuration: a model preset's, or by default ("demo") the tiny preset's with
    the demo's own model and training."""
    data = preset_config("tiny" if preset == "demo" else preset).model_dump(mode="json")
    if preset == "demo":
        data["model"] = DEMO_MODEL
        data["data"]["max_seq_length"] = DEMO_MODEL["max_position_embeddings"]
        data["training"].update(DEMO_TRAINING)
    data["averaging"]["checkpoint_every_epochs"] = CHECKPOINT_EVERY_EPOCHS
    return RunConfig.model_validate(data)


def demo_probes_ensure(*, run: Run, organizer: User) -> None:
    """The demo run's downstream probes: entity tags for the names and cities the corpus generator
    inserts, and whether a sentence's liked one is a person, a place or a thing (runs/setup/labelled.py)."""
    for name, task, (train, test) in (("names-and-places", Probe.Task.TOKENS, entity_sets()),
                                      ("person-place-thing", Probe.Task.TEXT, kind_sets())):
        if not run.probes.filter(name=name).exists():
            probe_add(run=run, actor=organizer, name=name, task=task, train=train.encode(), test=test.encode())


def web_command(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", host, "--port", str(port),
            "--log-level", "warning", "--timeout-graceful-shutdown", "5"]


def worker_command() -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "portal", "worker", "--beat", "-Q", "celery", "--pool=solo",
            "--hostname=worker@%h", "--loglevel=WARNING"]


def evaluator_command() -> list[str]:
    """The worker of the evaluations queue (portal/settings.py, CELERY_TASK_ROUTES): while it scores a
    checkpoint for minutes, the other worker keeps the board live."""
    return [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", "evaluations", "--pool=solo",
            "--hostname=evaluator@%h", "--loglevel=WARNING"]


def validator_command(name: str = "validator", loglevel: str = "WARNING") -> list[str]:
    """A validator worker (runs/swarm/recompute.py): the demo's coordinator only schedules its spot checks, as a
    run whose volunteers outgrow one host would, and this worker recomputes them. Its module loads torch, which
    no other worker needs. bench/validators.py starts several, each named apart."""
    return [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", "validations", "--include",
            "runs.swarm.recompute", "--pool", "solo", f"--hostname={name}@%h", f"--loglevel={loglevel}"]


def coordinator_command() -> list[str]:
    return [sys.executable, "manage.py", "run_coordinator"]


def agent_launch(volunteer: User, url: str, home, slug: str = RUN_SLUG) -> tuple[list[str], dict]:
    """The `peer-agent join` command and environment of a local agent of ``volunteer`` (a fresh token) for the
    run ``slug`` (the demo's unless a bench names its own)."""
    _, secret = token_create(user=volunteer, name=f"demo agent of {volunteer.username}", lifetime=datetime.timedelta(days=1))
    # Client mode off: loopback looks unreachable to "auto", but the local peers can reach each other.
    env = {"PEER_AGENT_TOKEN": secret, "PEER_AGENT_HOME": str(home), "PEER_AGENT_THREADS": "1",
           "PEER_AGENT_HOST": "/ip4/127.0.0.1/tcp/0", "PEER_AGENT_CLIENT_MODE": "off"}
    return [sys.executable, "-m", "peer_agent", "join", "--portal", url, slug], env


def backbone_wait(run: Run, since: datetime.datetime, timeout: float = 300) -> None:
    """Wait until the coordinator has announced the run's backbone peer (a heartbeat after ``since``:
    the addresses of an earlier demo's peer are gone with it)."""
    deadline = time.monotonic() + timeout
    while True:
        run.refresh_from_db()
        if run.initial_peers and run.coordinator_heartbeat_at and run.coordinator_heartbeat_at > since:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the coordinator did not start its backbone peer within {timeout:.0f} s; see its log above")
        time.sleep(1)


class Command(BaseCommand):
    help = "Run the portal, worker, coordinator and training agents on embedded defaults until Ctrl-C."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("DEMO_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "8000")))
        parser.add_argument("--agents", type=int, default=int(os.environ.get("DEMO_AGENTS", "2")), choices=range(0, 5))
        parser.add_argument("--preset", default=os.environ.get("DEMO_PRESET", "demo"),
                            choices=["demo", "tiny", "base", "large"])

    def handle(self, *args, host: str, port: int, agents: int, preset: str, **options) -> None:
        call_command("migrate", verbosity=0)
        self.stdout.write("preparing the demo run (first time: generating a corpus and training its tokenizer)…")
        organizer, volunteers = demo_people_ensure(max(agents, 2))
        run = demo_run_ensure(organizer=organizer, preset=preset)
        call_command("agent_wheel", verbosity=0)
        url = f"http://{host}:{port}"
        # The links of the e-mails the web server and the worker send (a sign-up's, a milestone's) lead to this
        # demo, on whatever port it was given, unless the operator named the site's address.
        os.environ.setdefault("SITE_URL", url)
        self.processes: list[tuple[str, subprocess.Popen]] = []
        # Stop on Ctrl-C and SIGTERM alike, even when started with SIGINT ignored (as a background
        # job of a script is, or a child of a process whose hivemind averagers ignored it).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        started = timezone.now()
        try:
            self._start("web", web_command(host, port))
            self._start("worker", worker_command())
            self._start("evaluator", evaluator_command())
            self._start("coordinator", coordinator_command(), {"SPOT_CHECK_WORKERS": "1"})
            backbone_wait(run, since=started)
            # Only now: its start (torch, hivemind, the data pipeline) slowed the coordinator's on a loaded machine
            # (CI66), and the checks it consumes are queued once agents train.
            self._start("validator", validator_command())
            for volunteer in volunteers[:agents]:
                home = settings.VAR_DIR / "demo-agents" / volunteer.username
                self._start(f"agent {volunteer.username}", *agent_launch(volunteer, url, home))
            self._banner(url, run, volunteers[: max(agents, 2)])
            self._watch()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
            self.stdout.flush()  # a second Ctrl-C now kills (see _stop_all): say first that the stop began
        finally:
            self._stop_all()

    def _start(self, name: str, command: list[str], env: dict | None = None) -> None:
        process = subprocess.Popen(command, cwd=settings.BASE_DIR, env={**os.environ, **(env or {})}, start_new_session=True)
        self.processes.append((name, process))

    def _banner(self, url: str, run: Run, volunteers: list[User]) -> None:
        lines = [
            "", self.style.SUCCESS(f"DeDLOC Portal demo: {url}"),
            f"  the run, live:  {url}{run.get_absolute_url()}",
            f"  organizer:      log in as {ORGANIZER[0]!r} with password {ORGANIZER[1]!r}",
        ]
        passwords = dict(VOLUNTEERS)
        lines += [f"  volunteer:      log in as {v.username!r} with password {passwords[v.username]!r}" for v in volunteers]
        lines += ["  Ctrl-C stops everything.", ""]
        self.stdout.write("\n".join(lines))

    def _watch(self) -> None:
        while True:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise SystemExit(f"{name} exited with status {process.returncode}; stopping the demo")
            time.sleep(1)

    def _stop_all(self) -> None:
        # Agents first, while the web server still listens, so that their last reports land; then the
        # coordinator, the worker and the web server.
        agents = [process for name, process in self.processes if name.startswith("agent")]
        portal = [process for name, process in reversed(self.processes) if not name.startswith("agent")]
        try:
            # Ctrl-C for an agent (its whole group: hivemind's processes leave it to the agent); SIGTERM to
            # each portal process alone, as `docker compose stop` sends it, so it ends its children itself.
            self._stop(agents, lambda process: os.killpg(process.pid, signal.SIGINT), within=AGENT_STOP_SECONDS)
            self._stop(portal, lambda process: process.terminate(), within=PORTAL_STOP_SECONDS)
            self.stdout.write("demo stopped.")
        except KeyboardInterrupt:
            # A second Ctrl-C (or a SIGTERM) while stopping: no more waiting, and no process left behind
            # holding the port or the run's duties (each runs in a session, out of the terminal's reach).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for _, process in self.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            for _, process in self.processes:
                process.wait()
            self.stdout.write("demo killed: asked twice to stop.")

    def _stop(self, processes: list[subprocess.Popen], ask, within: float) -> None:
        """Ask each running process to stop, wait for them together, and kill the groups of those still
        running; say how long each took, so that a slow stop shows."""
        names = {process.pid: name for name, process in self.processes}
        asked_at = time.monotonic()
        for process in processes:
            if process.poll() is None:
                ask(process)
        deadline = asked_at + within
        for process in processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
                self.stdout.write(f"{names[process.pid]} stopped ({time.monotonic() - asked_at:.1f} s)")
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                self.stdout.write(f"{names[process.pid]} killed: still running after {within:.0f} s")
