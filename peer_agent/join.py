"""``peer-agent join``: join a run, enter the swarm, train and report until something stops it.

A paused run is waited out and joined again as a new session; Ctrl-C, SIGTERM and ``--max-runtime``
stop after the current step, send the last reports and leave the swarm. Ctrl-C and SIGTERM do so within
``STOP_WITHIN_S``: a step still running after ``STEP_GRACE_S`` (one in an averaging round can wait for up to
the run's ``averaging_timeout``) is abandoned, and its samples are neither reported nor credited.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import ValidationError
from rich.console import Console

from peer_agent import __version__
from peer_agent.device import device_info, device_resolve
from peer_agent.display import LOG_FIELDS, DownloadProgress, ProgressDisplay, ProgressSnapshot
from peer_agent.exit_status import EXIT_OK, EXIT_STOPPED
from peer_agent.i18n import _
from peer_agent.portal import (
    PAUSE_CODES,
    RETRY_LATER_CODES,
    SESSION_OVER_CODES,
    AccessRefresher,
    CreditWatcher,
    PortalClient,
    PortalError,
    PortalRefused,
    PortalUnavailable,
    RunWatcher,
    StopReason,
)
from peer_agent.protocol import (
    DeviceInfo,
    EpochCommitment,
    JoinRequest,
    JoinResponse,
    MachineCredit,
    PeerRole,
    RunConfig,
    join_proof_message,
)
from peer_agent.reachability import reachability_probe
from peer_agent.reporter import Reporter
from peer_agent.settings import AgentSettings, SettingsError, settings_from_args
from peer_agent.spool import spool_previous_session
from peer_agent.tokenizer import tokenizer_load

if TYPE_CHECKING:
    from hivemind.utils.crypto import RSAPrivateKey

    from peer_agent.swarm_progress import SwarmProgress
    from peer_agent.training import StepResult, Trainer

logger = logging.getLogger(__name__)

PAUSE_RETRY_S = 60.0
COORDINATOR_RETRY_S = 10.0
RUN_POLL_S = 60.0
FLUSH_TIMEOUT_S = 10.0
# Ctrl-C and SIGTERM stop the agent within STOP_WITHIN_S, as `docker compose stop` and `make demo` expect:
# STEP_GRACE_S for the current step, then the last reports (at most FLUSH_TIMEOUT_S, less when the step
# took its grace) and leaving the swarm (hivemind's averagers have 5 s each to stop, run in parallel here
# only as far as hivemind does: SHUTDOWN_RESERVE_S is what is kept for them).
STOP_WITHIN_S = 10.0
STEP_GRACE_S = 3.0
SHUTDOWN_RESERVE_S = 4.0
_CLEAN_STOPS = ("stopped_by_you", "max_runtime")


class StepAbandoned(Exception):
    """The step in progress was left unfinished so that the agent stops in time (``StopRequest.step``)."""


def exit_at_once(code: int) -> None:
    """End the process once its work is stopped and kept, waiting for nothing more: the records written, the
    children of hivemind (its DHT and averagers) ended, and then ``os._exit``. The interpreter's own teardown
    can hold the exit past a stop's bound: hivemind's step executor waiting on a call its DHT process never
    received (swarm_leave), or torch's finalizers and the freeing of its modules, measured at 8.7 s of a
    coordinator's 9.1 s stop at load 15 (the agent's STOP_WITHIN_S, tests/test_process_stops.py's 10 s)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    for child in multiprocessing.active_children():  # hivemind's DHT and averagers, if still there
        child.terminate()
    os._exit(code)


class StopRequest:
    """Ctrl-C or SIGTERM: stop after the current step, flush reports and leave the swarm; twice quits at once.

    A step that runs past ``step_grace`` seconds after the request is abandoned: the main thread gets
    SIGUSR1, whose handler raises ``StepAbandoned`` inside ``step()``. A real signal, because it wakes
    the main thread from the lock hivemind's averaging round waits on, which ``_thread.interrupt_main``
    would not.

    Also the coordinator's (``manage.py run_coordinator``), with its own ``event`` and ``notice``: any
    process that forks hivemind's DHT and averagers needs what ``_handle`` does for forked children.
    """

    def __init__(self, event: threading.Event | None = None,
                 notice: str = "Stopping after the current step and sending the last reports (Ctrl-C again to quit now)",
                 step_grace: float = STEP_GRACE_S) -> None:
        self.event = event or threading.Event()
        self.notice = notice
        self.step_grace = step_grace
        self.requested_at: float | None = None
        self._pid = os.getpid()
        self._in_step = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        signal.signal(signal.SIGUSR1, self._abandon)

    @contextlib.contextmanager
    def step(self):
        """Mark the main thread's current step as one the stop may abandon after ``step_grace``."""
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False

    def time_left(self, budget: float = STOP_WITHIN_S) -> float:
        """Seconds left of ``budget`` since the stop was asked for (all of it while nobody asked)."""
        if self.requested_at is None:
            return budget
        return max(0.0, budget - (time.monotonic() - self.requested_at))

    def _abandon(self, signum: int, frame: object) -> None:
        if os.getpid() == self._pid and self._in_step:
            raise StepAbandoned(f"the step was still running {self.step_grace:g} s after the stop was asked for")

    def _handle(self, signum: int, frame: object) -> None:
        if os.getpid() != self._pid:
            # A hivemind process forked from this one inherited this handler. Ctrl-C reaches the whole
            # process group: leave it to the parent to shut its children down; SIGTERM must still end
            # them (hivemind's last resort for a child that does not stop is to terminate it).
            if signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if self.event.is_set():
            raise KeyboardInterrupt
        self.requested_at = time.monotonic()
        self.event.set()
        logger.info("%s", self.notice)
        main = threading.main_thread().ident
        timer = threading.Timer(self.step_grace, lambda: self._in_step and signal.pthread_kill(main, signal.SIGUSR1))
        timer.daemon = True
        timer.start()


def parent_watch(parent: int, every_s: float = 1.0) -> None:
    """Stop as SIGTERM does once process ``parent``, which started this one, is gone (a notebook's kernel
    killed without notice, peer_agent/notebook.py): otherwise the agent would train on, orphaned, and a
    kernel started again would run a second agent beside it. Named by its pid, not read with getppid()
    here: a parent that died before this line would go unnoticed."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        logger.warning(_("The program that started this agent is gone; stopping"))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@dataclass
class _Tally:
    """The work since the previous report (``samples`` in a report is this delta)."""

    samples: int = 0
    steps: int = 0
    loss_sum: float = 0.0
    losses: int = 0
    local_epoch: int = 0
    since: float = field(default_factory=time.monotonic)

    def add(self, result: StepResult, epoch: int) -> None:
        self.samples, self.steps, self.local_epoch = self.samples + result.samples, self.steps + 1, epoch
        if not result.skipped and math.isfinite(result.loss) and result.loss >= 0:
            self.loss_sum, self.losses = self.loss_sum + result.loss, self.losses + 1

    def send(self, reporter: Reporter, until: float | None = None, commitments: list[EpochCommitment] | None = None) -> _Tally:
        """Spool a report of the work up to ``until`` (now by default), with the oldest of ``commitments``
        (taken from the list) unless that is for a later epoch than this tally's, and return a fresh
        tally whose time starts there. The portal refuses a commitment that comes with a report of an
        earlier epoch (runs/ingest/reports.py): a step that loaded the swarm's state jumps the epoch, so
        the next step can close a later epoch while the tally still holds the step of the old one."""
        until = time.monotonic() if until is None else until
        if self.steps:
            elapsed = max(until - self.since, 1e-6)
            fits = bool(commitments) and commitments[0].epoch <= self.local_epoch
            reporter.report(samples=self.samples, steps=self.steps, local_epoch=self.local_epoch,
                            loss=self.loss_sum / self.losses if self.losses else None,
                            samples_per_second=self.samples / elapsed,
                            commitment=commitments.pop(0) if fits else None)
        return _Tally(since=until)


def join_command(args: argparse.Namespace, console: Console) -> int:
    settings = settings_from_args(args)
    settings.require("portal", "run", "token")
    # the ML stack loads only when a command trains: `peer-agent --help`, `login`, `stats` never pay for it
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")  # hivemind's messages go through our handler, above the progress line
    logging.getLogger("hivemind").setLevel(logging.INFO if args.verbose else logging.WARNING)
    stop = StopRequest()
    stop.install()
    if args.stop_with_parent:
        parent_watch(args.stop_with_parent)
    deadline = time.monotonic() + settings.max_runtime if settings.max_runtime else math.inf
    sessions = 0
    with PortalClient(settings.portal, settings.token) as portal:
        while True:
            outcome = _session_train(settings, portal, console, stop, deadline, patient=sessions > 0)
            sessions += 1
            if outcome is None or outcome.code in _CLEAN_STOPS:
                return EXIT_OK
            if not outcome.rejoin:
                logger.error(_("Training stopped: %s"), outcome.detail)
                return EXIT_STOPPED
            if outcome.code not in RETRY_LATER_CODES:  # those were said when they happened
                logger.warning(_("Training paused: %s. The agent will join again when the run is active."), outcome.detail)
            if stop.event.is_set() or time.monotonic() >= deadline:
                return EXIT_OK


def join_request_signed(key: RSAPrivateKey, *, run: str, agent_version: str, device: DeviceInfo,
                        role: PeerRole = "trainer", per_device_batch_size: int | None = None,
                        replaces_session: int | None = None) -> JoinRequest:
    """A join for ``run`` as ``role``, signed with ``key``, which proves to the portal that this agent holds it,
    declaring the agent's ``--per-device-batch-size`` override if any and the session its start replaces."""
    peer_public_key = key.get_public_key().to_bytes().decode()
    signed_at = datetime.datetime.now(datetime.UTC)
    proof = key.sign(join_proof_message(run=run, peer_public_key=peer_public_key, signed_at=signed_at)).decode()
    return JoinRequest(peer_public_key=peer_public_key, agent_version=agent_version, device=device,
                       signed_at=signed_at, key_proof=proof, role=role, per_device_batch_size=per_device_batch_size,
                       replaces_session=replaces_session)


def _join_when_active(settings: AgentSettings, portal: PortalClient, request: Callable[[], JoinRequest], stop: StopRequest,
                      deadline: float, patient: bool) -> JoinResponse | None:
    """Join, waiting out pauses, a coordinator that is down (and, when ``patient``, an unreachable
    portal), with a join signed afresh each time; None if stopped meanwhile."""
    said = set()
    while True:
        wait = PAUSE_RETRY_S
        try:
            return portal.join(settings.run, request())
        except PortalRefused as refused:
            if refused.code in RETRY_LATER_CODES:
                wait = refused.retry_after or COORDINATOR_RETRY_S
            elif not refused.paused:
                raise
            if refused.detail not in said:  # once per reason, not every retry
                said.add(refused.detail)
                logger.warning("%s", refused.detail)
        except PortalUnavailable as exc:
            if not patient:
                raise
            logger.warning(_("%s; trying again in %.0f s"), exc, wait)
        if stop.event.wait(max(0.0, min(wait, deadline - time.monotonic()))) or time.monotonic() >= deadline:
            return None


def _session_train(settings: AgentSettings, portal: PortalClient, console: Console, stop: StopRequest,
                   deadline: float, patient: bool) -> StopReason | None:
    """One session: join, fetch files, enter the swarm, train until something stops it."""
    # the ML stack loads only when a command trains: `peer-agent --help`, `login`, `stats` never pay for it
    from hivemind.utils.crypto import RSAPrivateKey

    from peer_agent.authorizer import PortalAuthorizer, rsa_public_key_parse
    from peer_agent.bandwidth import client_mode_choose, declared_bandwidth, measure_probe
    from peer_agent.checkpoint import PAUSED_STATE_DIR
    from peer_agent.model import averaged_bytes, precision_choose, precision_describe
    from peer_agent.spotcheck import data_seed
    from peer_agent.training import SwarmUnreachable, Trainer, TrainerSetup

    device = device_resolve(settings.device)
    try:
        policy = RunConfig.model_validate(portal.run_summary(settings.run)["config"]).training.precision
    except (PortalUnavailable, KeyError, ValueError) as exc:  # the join below decides whether to wait or give up
        logger.debug("Could not read the run's precision policy: %s", exc)
        policy = "auto"
    key = RSAPrivateKey()
    info = device_info(device, precision_choose(device, policy))
    request = functools.partial(join_request_signed, key, run=settings.run, agent_version=__version__, device=info,
                                per_device_batch_size=settings.per_device_batch_size,
                                replaces_session=spool_previous_session(settings.resolved_spool_dir(), run=settings.run))
    joined = _join_when_active(settings, portal, request, stop, deadline, patient)
    if joined is None:
        return None
    LOG_FIELDS.update(run=settings.run, session_id=joined.session_id)
    logger.info(_("Joined run “%s” as session %d"), settings.run, joined.session_id)
    config = _config_for_machine(joined.config, settings)
    files = settings.resolved_cache_dir() / joined.run_id
    tokenizer = portal.download(joined.tokenizer_url, files / "tokenizer.json", authorize=True)
    try:
        measurement = measure_probe(portal, lambda: tokenizer)
    except PortalError as exc:  # the bandwidth declared is advice for load balancing: train without it
        logger.warning(_("Could not time transfers to the portal: %s"), exc)
        measurement = None
    data_files = _data_files(portal, joined.data_files, files / "data") if config.data.source == "files" else None
    bandwidth, source = declared_bandwidth(settings.bandwidth_mbps, measurement, config.averaging.min_bandwidth_mbps)
    announce = [settings.announce] if settings.announce else None
    reach = _reachability(settings, config, joined.initial_peers, announce)
    vector_bytes = averaged_bytes(config) if reach is not None and reach.path == "relayed" else None
    client_mode, why = client_mode_choose(settings.client_mode, config.averaging.client_mode, reach, vector_bytes)
    relayed = not client_mode and reach is not None and reach.path == "relayed"
    logger.info(_("Bandwidth: %s; declaring %.1f Mbit/s: %s"), measurement.describe() if measurement else _("not measured"),
                bandwidth, source)
    logger.info(_("Client mode %s: %s"), _("on") if client_mode else _("off"), why)
    logger.info(_("Training on %s in %s"), device, precision_describe(precision_choose(device, config.training.precision)))

    refusals = multiprocessing.SimpleQueue()
    refresher = AccessRefresher(settings.portal, settings.token, joined.session_id,
                                joined.hivemind_access.model_dump(mode="json"), refusals)
    authorizer = PortalAuthorizer(key, rsa_public_key_parse(joined.authority_public_key), refresher)
    extra = {}
    if relayed:
        extra["relayed"] = True  # its addresses are the relays' now: an announced one would hide them
    elif announce and "announce_maddrs" in TrainerSetup.__dataclass_fields__:
        extra["announce_maddrs"] = announce
    elif announce:
        logger.warning(_("--announce only decides client mode here: this trainer cannot announce the address to peers"))
    checkpoint = functools.partial(_checkpoint_fetch, portal, joined.checkpoint_url, files / "checkpoints") \
        if joined.checkpoint_url else None
    kept = files / PAUSED_STATE_DIR
    extra["checkpoint_fetch"] = functools.partial(_resume_source, checkpoint, kept)
    setup = TrainerSetup(config=config, run_id=joined.run_id, initial_peers=joined.initial_peers, client_mode=client_mode,
                         bandwidth=bandwidth, authorizer=authorizer, private_key=key, host_maddrs=[settings.host],
                         device=device, threads=settings.threads, seed=data_seed(joined.run_id, joined.session_id),
                         session_id=joined.session_id, data_files=data_files, **extra)
    logger.info(_("Entering the swarm and loading the collaboration's state (this can take a few minutes)"))
    try:
        trainer = Trainer(setup, tokenizer_load(files / "tokenizer.json"))
    except SwarmUnreachable as exc:
        logger.debug("Could not enter the swarm: %s", exc, exc_info=True)
        detail = f"the coordinator of run “{settings.run}” is not reachable now; the agent will retry every " \
                 f"{COORDINATOR_RETRY_S:.0f} s"
        logger.warning("%s", detail)
        stop.install()  # the failed start may have taken Ctrl-C, as hivemind's averagers do
        stop.event.wait(max(0.0, min(COORDINATOR_RETRY_S, deadline - time.monotonic())))
        return StopReason("coordinator_unavailable", detail)
    # hivemind's averagers set SIGINT to "ignore" in this process when they start: take Ctrl-C back.
    stop.install()
    try:
        reporter = Reporter(settings.resolved_spool_dir(), settings.token, session_id=joined.session_id,
                            report_url=joined.report_url, run=settings.run).start()
        watcher = RunWatcher(settings.portal, settings.run, RUN_POLL_S)
        credit = CreditWatcher(settings.portal, settings.token, joined.session_id, RUN_POLL_S)
        try:
            reason = _train_loop(trainer, reporter, [watcher], refusals, stop, deadline, settings, console, credit)
            if reason.pause:
                _state_keep(trainer, kept)
            return reason
        finally:
            # The swarm stops counting this peer now, while the last reports go out.
            threading.Thread(target=trainer.progress_withdraw, name="progress-withdraw", daemon=True).start()
            watcher.close()
            credit.close()
            flush_timeout = min(FLUSH_TIMEOUT_S, max(1.0, stop.time_left() - SHUTDOWN_RESERVE_S))
            logger.info(_("Sending the last reports (at most %.0f s)"), flush_timeout)
            reporter.close(flush_timeout)
    finally:
        logger.info(_("Leaving the swarm"))
        swarm_leave(trainer, within=max(stop.time_left(), SHUTDOWN_RESERVE_S))


def swarm_leave(trainer: Trainer, *, within: float) -> bool:
    """Shut the trainer down, waiting at most ``within`` seconds; whether it finished in time.

    hivemind's shutdown can wait without a timeout on a call its DHT process never received (a CI
    run of tests/test_demo.py: the DHT process failed to read a message from the agent while both
    were stopping, and the agent waited until the demo killed it). The shutdown runs in a daemon
    thread, so the agent keeps its STOP_WITHIN_S; hivemind's processes, daemons too, end with it."""
    leaving = threading.Thread(target=trainer.shutdown, name="swarm-leave", daemon=True)
    leaving.start()
    leaving.join(within)
    if leaving.is_alive():
        logger.warning(_("Left the swarm without waiting for hivemind's shutdown, which took more than %.0f s"), within)
        return False
    return True


def _reachability(settings: AgentSettings, config: RunConfig, initial_peers: list[str],
                  announce: list[str] | None):
    """Ask a backbone peer to dial this machine back, unless client mode is decided without it."""
    if config.averaging.client_mode == "always" or settings.client_mode != "auto":
        return None
    logger.info(_("Asking a backbone peer to dial this machine back (directly, then through its relay)"))
    return reachability_probe(initial_peers, host_maddrs=[settings.host], announce_maddrs=announce)


def _train_loop(trainer: Trainer, reporter: Reporter, watchers: list[RunWatcher], refusals: object,
                stop: StopRequest, deadline: float, settings: AgentSettings, console: Console,
                credit: CreditWatcher) -> StopReason:
    tally, session_samples, shown_at, epoch_now = _Tally(), 0, 0.0, trainer.progress().local_epoch
    commitments: list[EpochCommitment] = []  # signed by the trainer as epochs close, sent with the next reports
    with ProgressDisplay(console, log_every_s=settings.progress_every) as display:
        while (reason := _stop_reason(stop, deadline, reporter, watchers, refusals)) is None:
            started = time.monotonic()
            try:
                with stop.step():
                    result = trainer.step()
            except StepAbandoned as exc:
                logger.info(_("Leaving the current step unfinished: %s"), exc)
                reason = _stop_reason(stop, deadline, reporter, watchers, refusals)
                break
            commitments += trainer.commitments_take()
            # hivemind counts a step's samples toward the epoch the step began in, and the coordinator
            # verifies reports per epoch against those counts: so a report never spans two epochs.
            # The split falls where this step began, so that its time goes with its samples (else
            # one step over a few microseconds reads as a burst the portal refuses).
            epoch, epoch_now = epoch_now, result.local_epoch
            if tally.steps and epoch != tally.local_epoch:
                tally = tally.send(reporter, until=started, commitments=commitments)
            tally.add(result, epoch)
            session_samples += result.samples
            if time.monotonic() - tally.since >= settings.report_interval:
                tally = tally.send(reporter, commitments=commitments)
            if time.monotonic() - shown_at >= 0.5:
                shown_at = time.monotonic()
                display.update(_snapshot(trainer.progress(), result, session_samples, reporter, credit.latest))
    tally.send(reporter, commitments=commitments)
    logger.info(_("Stopping: %s"), reason.detail)
    return reason


def _stop_reason(stop: StopRequest, deadline: float, reporter: Reporter, watchers: list[RunWatcher],
                 refusals: object) -> StopReason | None:
    if stop.event.is_set():
        return StopReason("stopped_by_you", "stopped by you")
    if time.monotonic() >= deadline:
        return StopReason("max_runtime", "reached --max-runtime")
    while not refusals.empty():
        code, detail = refusals.get()
        if code in PAUSE_CODES or code in SESSION_OVER_CODES:
            return StopReason(code, detail)
    return reporter.stop_reason or next((w.reason for w in watchers if w.reason), None)


def _snapshot(progress: SwarmProgress, result: StepResult, session_samples: int, reporter: Reporter,
              credit: MachineCredit | None) -> ProgressSnapshot:
    return ProgressSnapshot(
        local_samples_per_second=progress.local_samples_per_second, global_epoch=progress.global_epoch,
        collaboration_samples_per_second=progress.collaboration_samples_per_second, session_samples=session_samples,
        acked_samples=reporter.spool.summary().acked_samples, num_peers=progress.num_peers,
        eta_next_epoch_s=progress.eta_next_epoch_s, samples_accumulated=progress.samples_accumulated,
        target_batch_size=progress.target_batch_size, loss=None if result.skipped else result.loss,
        confirmed_samples=None if credit is None else credit.confirmed_samples,
        pending_samples=None if credit is None else credit.pending_samples)


def _config_for_machine(config: RunConfig, settings: AgentSettings) -> RunConfig:
    """The run's config with this machine's ``--per-device-batch-size`` override, validated."""
    if settings.per_device_batch_size is None:
        return config
    data = config.model_dump()
    data["training"]["per_device_batch_size"] = settings.per_device_batch_size
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(f"--per-device-batch-size {settings.per_device_batch_size} does not fit this run: "
                            f"{exc.errors()[0]['msg']}") from None


def _data_files(portal: PortalClient, urls: list[str], folder: Path) -> list[str]:
    """The run's uploaded text files, downloaded once into ``folder`` (signed links: no token sent)."""
    paths = []
    for url in urls:
        dest = folder / Path(urlsplit(url).path).name
        if not dest.exists():
            download = portal.download(url, dest, progress=DownloadProgress(_("Data file {name}").format(name=dest.name)))
            logger.info(_("Downloaded %s (%.1f MB)"), dest.name, download.size / 1e6)
        paths.append(str(dest))
    return paths


def _state_keep(trainer: Trainer, directory: Path) -> None:
    """Keep the trainer's state on disk while the run is paused (Trainer.state_keep)."""
    try:
        trainer.state_keep(directory)
        logger.info(_("Kept this peer's state of epoch %d to resume from when the run is active again"),
                    trainer.progress().local_epoch)
    except (OSError, RuntimeError) as exc:  # a full disk: the run's checkpoint or the peers' state still serve
        logger.warning(_("Could not keep this peer's state during the pause: %s"), exc)


def _resume_source(checkpoint: Callable[[], Path | None] | None, kept: Path) -> Path | None:
    """What a session starts from when no peer online has a state: the newer of the run's checkpoint
    and the state this agent kept when the run was paused; None for fresh weights."""
    # torch (through the checkpoint module) loads only once a session trains
    from peer_agent.checkpoint import checkpoint_metadata

    epochs = {}
    for source in (checkpoint() if checkpoint else None, kept):
        try:
            epochs[source] = checkpoint_metadata(source).epoch
        except (OSError, ValueError, TypeError):  # none, nothing kept, or a save cut short by a crash
            continue
    return max(epochs, key=epochs.get, default=None)


def _checkpoint_fetch(portal: PortalClient, url: str, folder: Path) -> Path | None:
    """The run's newest checkpoint, downloaded and unzipped into ``folder`` (signed link: no token
    sent); None when it cannot be had, and the agent starts from fresh weights."""
    # torch (through the checkpoint module) loads only once a session trains
    from peer_agent.checkpoint import checkpoint_unzip

    archive = folder / Path(urlsplit(url).path).name
    try:
        if not archive.exists():
            download = portal.download(url, archive, progress=DownloadProgress(_("The run's newest checkpoint")))
            logger.info(_("Downloaded the run's newest checkpoint (%.1f MB)"), download.size / 1e6)
        return checkpoint_unzip(archive, folder / archive.stem)
    except (PortalError, OSError, ValueError, zipfile.BadZipFile) as exc:
        logger.warning(_("Could not use the run's checkpoint, starting from fresh weights: %s"), exc)
        return None
