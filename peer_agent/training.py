"""The collaborative trainer: one volunteer's share of a DeDLOC run on hivemind.

A :class:`Trainer` joins the run's DHT, builds the model and ``hivemind.Optimizer`` (LAMB,
offloaded to host memory) the way sahajBERT trained, downloads the collaboration's current
state, and then runs local steps; hivemind averages gradients with the other peers whenever
the swarm has gathered ``target_batch_size`` samples, and applies one global LAMB step.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from hivemind.compression import (
    CompressionBase,
    Float16Compression,
    NoCompression,
    SizeAdaptiveCompression,
    Uniform8BitQuantization,
)
from hivemind.dht import DHT
from hivemind.optim.optimizer import Optimizer
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time
from transformers import PreTrainedTokenizerFast

from peer_agent.authorizer import PortalAuthorizer
from peer_agent.averaging import FlooredGradientAverager, MembersOnlyOptimizer
from peer_agent.checkpoint import (
    PAUSED_STATE_DIR,
    CheckpointMetadata,
    checkpoint_load_into,
    checkpoint_metadata,
    checkpoint_write,
)
from peer_agent.commitments import Commitments
from peer_agent.data import batches, dataset_stream
from peer_agent.display import DownloadProgress
from peer_agent.i18n import _
from peer_agent.metrics import MetricsPublisher, metrics_validators, owner_subkey
from peer_agent.model import model_build
from peer_agent.optim import Lamb, parameter_groups, schedule_build
from peer_agent.precision import Precision
from peer_agent.protocol import Compression, EpochCommitment, RunConfig, TrainingConfig
from peer_agent.reachability import relay_options
from peer_agent.recovery import BadStepRecovery
from peer_agent.steps import StepComputer
from peer_agent.swarm_progress import SwarmProgress, SwarmProgressReader

logger = logging.getLogger(__name__)


class SwarmUnreachable(Exception):
    """The run's initial peers (its coordinator's backbone) did not answer: the swarm cannot be entered now."""


# LAMB's first moments (peer_agent/optim.py), averaged with the parameters every epoch. hivemind averages only
# the parameters by default: two peers whose moments differ (one stepped once with its own gradients: its round
# found no group) then take different steps from the same averaged gradients, epoch after epoch, until the
# moments forget (0.9 an epoch), and every step they compute is at parameters no second peer serves, which
# the validator cannot check (runs/swarm/spotcheck.py). Measured in a demo beside a CI run: stretches of
# epochs with both agents 0.006-0.014 apart, all rejected. The second moments are left out: one epoch moves
# them by a thousandth (beta2 0.999), and their values (squared gradients) underflow fp16, the run's
# state_compression. This doubles the parameter averaging's traffic, which runs in the background.
AVERAGED_OPTIMIZER_STATISTICS = ("exp_avg",)
# The tracker's last report, then one DHT store; the whole leave has SHUTDOWN_RESERVE_S (peer_agent/join.py).
TRACKER_STOP_TIMEOUT_S = 1.5
PROGRESS_WITHDRAW_TIMEOUT_S = 2.0


@dataclass
class TrainerSetup:
    """Everything the CLI decides before training: the run, this peer's identity and its machine."""

    config: RunConfig
    run_id: str  # the run's hivemind key prefix
    initial_peers: list[str] = field(default_factory=list)
    client_mode: bool = False  # True when this peer cannot accept incoming connections
    bandwidth: float | None = None  # declared bandwidth in Mbit/s, for load balancing in all-reduce
    # Admits this peer to the run's DHT and, through its averagers, to gradient and parameter averaging groups.
    authorizer: PortalAuthorizer | None = None
    # A key of its own, never RSAPrivateKey.process_wide(): two peers in one process would
    # otherwise overwrite each other's progress and metrics records.
    private_key: RSAPrivateKey = field(default_factory=RSAPrivateKey)
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] | None = None  # addresses to advertise, e.g. behind port forwarding
    # Reachable only through the backbone peers' relays (a dial-back said so): peer_agent.reachability.
    relayed: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    threads: int | None = None  # torch CPU threads; None leaves torch's default
    seed: int = 0  # this peer's data order: peer_agent.spotcheck.data_seed of its session, so it can be replayed
    session_id: int = 0  # the portal's session, named in the commitments this peer signs
    data_files: list[str] | None = None  # the run's text files (data source "files")
    http_headers: dict[str, str] | None = None  # sent when fetching data files over http(s)
    progress_refresh_s: float = 10.0  # longest wait between reads of the swarm's progress
    backup_every: int = 50  # local steps between CPU backups of the parameters (and every epoch)
    # The run's newest checkpoint, unzipped; called only when no peer shared a state past epoch 0.
    checkpoint_fetch: Callable[[], Path | None] | None = None


@dataclass(frozen=True)
class StepResult:
    """What one local step did."""

    samples: int  # samples that went into the collaboration (0 for a skipped step)
    loss: float
    local_epoch: int
    global_epoch: int
    samples_per_second: float  # this step's throughput
    skipped: bool = False  # the loss or gradients were not finite and nothing was contributed


def compression_build(name: Compression) -> CompressionBase:
    """hivemind compression for a config value; "uniform8bit" keeps small tensors in fp16,
    as hivemind's ALBERT example does, since 8-bit quantization hurts biases and norms most."""
    if name == "none":
        return NoCompression()
    if name == "fp16":
        return Float16Compression()
    return SizeAdaptiveCompression(threshold=2**16 + 1, less=Float16Compression(), greater_equal=Uniform8BitQuantization())


class SwarmPeer:
    """A peer of the run's swarm: an ``optimizer`` (hivemind's, with its averagers and tracker) over a
    ``dht``, left in that order; a ``with`` block leaves at its end."""

    optimizer: Optimizer
    dht: DHT
    _shut_down = False
    _withdrawn = False
    _withdrawing: threading.Lock  # set by each subclass's __init__, with _shut_down

    def shutdown(self) -> None:
        """Say goodbye to the swarm: finish background averaging, stop the optimizer's averagers and
        tracker, then the DHT. Calling it again does nothing."""
        if self._shut_down:
            return
        self._shut_down = True
        try:
            self.progress_withdraw()
            self.optimizer.shutdown()
        finally:
            self.dht.shutdown()

    def progress_withdraw(self) -> None:
        """Stop reporting progress and clear this peer's record (once; :meth:`shutdown` does it first). The agent
        calls it as soon as it stops training, beside sending its last reports (peer_agent/join.py): on a loaded
        machine (a CI run of tests/e2e/test_preemption.py) the whole leave once ran out of its time before the
        clearing was done, and the swarm counted the peer for a minute more."""
        with self._withdrawing:
            if not self._withdrawn:
                self._withdrawn = True
                self._progress_withdraw()

    def _progress_withdraw(self) -> None:
        """Stop reporting progress and clear this peer's record, waiting until the DHT has the clearing
        store, before the rest of the goodbye. hivemind's tracker clears the record without waiting, after
        waiting up to its shutdown_timeout for its loops; on a busy machine the agent's leave ran out of
        SHUTDOWN_RESERVE_S (peer_agent/join.py) first, and the swarm counted a peer that had left until
        its record expired a minute later (a CI run of tests/e2e/test_preemption.py).

        The clearing is stamped after the tracker's loops end: woken by the shutdown, its reporter stores
        one more record before it sees the shutdown, and a DHT keeps the value that expires last, so a
        clearing stamped before that record (a loaded machine wakes the reporter's thread late) lost to it
        (another CI run of that test: the peer counted 20 s after it left)."""
        tracker = self.optimizer.tracker
        tracker.shutdown(timeout=0)
        if not tracker.shutdown_complete.wait(TRACKER_STOP_TIMEOUT_S):
            logger.debug("hivemind's progress tracker did not stop within %.0f s", TRACKER_STOP_TIMEOUT_S)
        try:
            stored = self.dht.store(tracker.training_progress_key, subkey=tracker._local_public_key, value=None,
                                    expiration_time=get_dht_time() + tracker.metadata_expiration,
                                    return_future=True).result(timeout=PROGRESS_WITHDRAW_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - leaving goes on; the record expires on its own
            stored = False
            logger.debug("Clearing the progress record failed: %r", error)
        if not stored:
            logger.warning("The swarm may count this peer for up to %.0f s more: its progress record "
                           "could not be cleared", tracker.metadata_expiration)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()


class Trainer(SwarmPeer):
    """One peer of a run: model, data, DHT and ``hivemind.Optimizer``; call :meth:`step` in a loop.

    Construction joins the swarm and downloads the collaboration's state, so a newcomer starts
    from the current parameters, optimizer statistics and learning-rate schedule. Batches come
    from the run's data unless ``batch_iterator`` is given.

    A step is the work of its parts, each a class of its own, as ``hivemind.Optimizer`` is made of a
    progress tracker, averagers and a grad scaler: the ``precision`` (autocast and loss scaling), the
    ``step_computer`` (micro-batches forward and backward, their fingerprints, the optimizer's step),
    the ``commitments`` (what the peer claims it computed, signed), the ``metrics`` it publishes, the
    ``recovery`` from bad steps and the ``swarm_progress`` it reads. ``step_computer_factory`` and
    ``commitments_factory`` build the two parts a test or a liar swaps (tests/security/liar_agent.py),
    called with the keywords :class:`~peer_agent.steps.StepComputer` and
    :class:`~peer_agent.commitments.Commitments` take.
    """

    def __init__(self, setup: TrainerSetup, tokenizer: PreTrainedTokenizerFast, *,
                 batch_iterator: Iterator[dict[str, torch.Tensor]] | None = None,
                 precision: Precision | None = None,
                 step_computer_factory: Callable[..., StepComputer] = StepComputer,
                 commitments_factory: Callable[..., Commitments] = Commitments):
        if "." in setup.run_id:
            raise ValueError(f"run id {setup.run_id!r} contains '.', which hivemind's averagers do not accept")
        self.setup, config, self.tokenizer = setup, setup.config, tokenizer
        if setup.threads:
            torch.set_num_threads(setup.threads)
        self.precision = precision or Precision.choose(setup.device, config.training.precision)
        self.model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                 init_seed=zlib.crc32(setup.run_id.encode())).to(setup.device)
        if batch_iterator is None:
            stream = dataset_stream(config, data_files=setup.data_files, seed=setup.seed, http_headers=setup.http_headers)
            batch_iterator = batches(tokenizer, config, stream, config.training.per_device_batch_size, seed=setup.seed)

        self._shut_down, self._withdrawing = False, threading.Lock()
        self.dht = dht_start(setup)
        try:
            self.optimizer = optimizer_build(setup, self.dht, self.model)
        except BaseException:
            self.dht.shutdown()
            raise
        # A joining volunteer waits on this download (parameters and optimizer moments): it sees a bar.
        self.optimizer.state_download_progress = DownloadProgress(_("The swarm's state"))
        try:
            logger.info("Loading the collaboration's state from peers (if any)")
            with warnings.catch_warnings():
                # hivemind fast-forwards the schedule to the swarm's epoch before our first step; torch
                # mistakes that for calling the scheduler and the optimizer in the wrong order.
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
                self.optimizer.load_state_from_peers()
                if self.optimizer.local_epoch == 0 and setup.checkpoint_fetch is not None:
                    self._checkpoint_resume(setup.checkpoint_fetch)
        except BaseException:
            self.shutdown()
            raise

        self.recovery = BadStepRecovery(self.optimizer, self.precision, backup_every=setup.backup_every)
        self.metrics = MetricsPublisher(
            self.dht, setup.run_id, setup.private_key, epoch=self.optimizer.local_epoch,
            samples_per_second=lambda: float(self.optimizer.tracker.performance_ema.samples_per_second))
        self.swarm_progress = SwarmProgressReader(self.dht, setup.run_id, self.optimizer)
        self.step_computer = step_computer_factory(model=self.model, optimizer=self.optimizer, precision=self.precision,
                                                   batches=batch_iterator, training=config.training, run_id=setup.run_id)
        self.commitments = commitments_factory(config, run_id=setup.run_id, session_id=setup.session_id,
                                               key=setup.private_key, local_epoch=lambda: self.optimizer.local_epoch)

    def step(self) -> StepResult:
        """Run one local step (:meth:`StepComputer.compute <peer_agent.steps.StepComputer.compute>`), then commit
        to it if the swarm counted it, tally it in the metrics, and back up or recover."""
        training = self.setup.config.training
        started = time.perf_counter()
        computed = self.step_computer.compute()
        samples = training.per_device_batch_size * training.gradient_accumulation_steps if computed.accepted else 0
        if not computed.contributed:
            self.recovery.after_bad_step(computed.loss)
        else:
            if computed.accepted:
                self.commitments.step_commit(computed.epoch, computed.cursor, computed.fingerprints, computed.parameters)
            self.metrics.step_add(loss=computed.loss, samples=samples, epoch=self.optimizer.local_epoch)
            self.recovery.after_good_step()

        elapsed = time.perf_counter() - started
        return StepResult(samples=samples, loss=computed.loss, local_epoch=self.optimizer.local_epoch,
                          global_epoch=self.optimizer.tracker.global_epoch,
                          samples_per_second=samples / elapsed if elapsed > 0 else 0.0, skipped=not computed.contributed)

    def progress(self) -> SwarmProgress:
        """This peer's and the collaboration's progress, from what hivemind last read (never blocks)."""
        return self.swarm_progress.progress()

    def commitments_take(self) -> list[EpochCommitment]:
        """The signed commitments of the epochs this peer closed since the last call, oldest first."""
        return self.commitments.take()

    @property
    def public_key_subkey(self) -> bytes:
        """The subkey under which this peer's signed progress and metrics records appear."""
        return owner_subkey(self.setup.private_key)

    def _checkpoint_resume(self, fetch: Callable[[], Path | None]) -> None:
        """Start from the newest state saved (the run's checkpoint, or this agent's own state kept at a
        pause) instead of fresh weights: nobody online had a newer state. A checkpoint of epoch 0 is the
        run's start (another run's weights or a Hugging Face model, runs/setup/start.py), loaded too: the
        peer is at epoch 0 already, but at the run's random initialization."""
        directory = fetch()
        if directory is None:
            return
        if checkpoint_metadata(directory).epoch < self.optimizer.local_epoch:
            return
        epoch = checkpoint_load_into(directory, model=self.model, optimizer=self.optimizer)
        if directory.name == PAUSED_STATE_DIR:
            source = "the state this agent kept at the pause"
        else:
            source = "the run's checkpoint" if epoch else "the run's start"
        logger.info("No peer had a newer state: resumed from %s of epoch %d", source, epoch)

    def state_keep(self, directory: Path) -> None:
        """Save this peer's state (parameters, optimizer, epoch) as a checkpoint into ``directory``: what
        the agent resumes from when the run it paused in becomes active again and nobody online has a
        newer state. Without it a pause would lose the training since the run's last checkpoint."""
        metadata = CheckpointMetadata(run_id=self.setup.run_id, epoch=self.optimizer.local_epoch, loss=None,
                                      samples=0, time=time.time())
        checkpoint_write(directory, model=self.model, tokenizer=self.tokenizer,
                         optimizer_state=self.optimizer.state_dict(), metadata=metadata)


def dht_start(setup: TrainerSetup) -> DHT:
    """This peer's DHT node in the run's swarm; :class:`SwarmUnreachable` if no initial peer answers."""
    try:
        return DHT(
            start=True, initial_peers=setup.initial_peers or None, client_mode=setup.client_mode,
            host_maddrs=setup.host_maddrs, announce_maddrs=None if setup.relayed else setup.announce_maddrs,
            authorizer=setup.authorizer, startup_timeout=60,
            record_validators=metrics_validators(setup.run_id, setup.private_key),
            **relay_options(setup.initial_peers, relayed=setup.relayed))
    except P2PDaemonError as exc:
        # The p2p daemon refuses to start when none of its initial peers answers.
        if setup.initial_peers and "bootstrap" in str(exc):
            raise SwarmUnreachable(f"none of the run's {len(setup.initial_peers)} initial peers answered") from exc
        raise


def lamb_factory(training: TrainingConfig) -> partial:
    """The run's LAMB, for hivemind to build over its (offloaded) parameters."""
    return partial(Lamb, lr=training.learning_rate, weight_decay=training.weight_decay,
                   clamp_value=training.clamp_value, eps=1e-6, debias=True)


def schedule_factory(training: TrainingConfig) -> partial:
    """The run's learning-rate schedule, which hivemind steps once per collaboration epoch."""
    return partial(schedule_build, warmup_steps=training.warmup_steps, total_steps=training.total_steps)


def next_chunk_timeout(matchmaking_time: float, averaging_timeout: float) -> float:
    """How long a round waits for a member's next chunk before it averages without that member's part.
    hivemind waits ``matchmaking_time`` (the demo's 2 s): beside a CI run (load 10 on 2 cores) members'
    chunks came later than that, the rounds came back partial ("Averaging: received 48.5% results";
    each peer puts its own values in place of the missing part) and the two agents stepped apart for
    dozens of epochs, which earned nothing (docs/benchmarks.md, section 19). A quarter of the round's
    time lets a slow member's part in; a member that is gone costs the round that long."""
    return max(matchmaking_time, averaging_timeout / 4)


def optimizer_build(setup: TrainerSetup, dht: DHT, model: torch.nn.Module, *, auxiliary: bool = False) -> Optimizer:
    """``hivemind.Optimizer`` with LAMB and the run's averaging settings.

    In hivemind 1.1.12 ``averager_opts`` reach only the state averager, so the declared
    bandwidth and group size go to the gradient averager (where DeDLOC's bandwidth-aware
    partitioning matters most) through ``grad_averager_factory``, whose averager keeps a slow
    peer's share of the vector above 0. Given the setup's authorizer, both averagers average only
    with peers that hold an access token (``peer_agent.averaging``), and the Optimizer keeps the
    authorizer's token fresh in a thread of its own. The gradient averager combines each part of
    the all-reduce by the run's ``aggregation`` (``peer_agent.aggregation``). ``client_mode`` must equal the DHT's: the
    Optimizer replaces an explicit value with ``dht.client_mode`` anyway.

    ``delay_updates`` (delayed parameter updates) delays the optimizer step and gradient
    averaging; parameter averaging always runs in the background, as hivemind defaults to:
    done in line, each epoch holds two matchmaking rounds in a row, and two peers that fall half
    an epoch apart (one averaging gradients while the other averages parameters) keep missing
    each other until the collaboration is split for good.

    ``auxiliary`` builds an aggregator's optimizer (``peer_agent.aggregator``): it joins the same rounds
    with its bandwidth but accumulates no batches and never steps.
    """
    training, averaging = setup.config.training, setup.config.averaging
    delay = averaging.delay_updates
    # Matchmaking requests must time out well before a matchmaking round ends.
    averager_opts = dict(bandwidth=setup.bandwidth, target_group_size=averaging.target_group_size,
                         request_timeout=min(3.0, averaging.matchmaking_time / 2))
    return MembersOnlyOptimizer(
        dht=dht, run_id=setup.run_id, authorizer=setup.authorizer, aggregation=averaging.aggregation,
        params=parameter_groups(model, training.weight_decay),
        optimizer=lamb_factory(training), scheduler=schedule_factory(training),
        target_batch_size=training.target_batch_size,
        batch_size_per_step=None if auxiliary else training.per_device_batch_size * training.gradient_accumulation_steps,
        auxiliary=auxiliary, offload_optimizer=True,
        delay_optimizer_step=delay, delay_grad_averaging=delay, delay_state_averaging=True,
        average_opt_statistics=AVERAGED_OPTIMIZER_STATISTICS,
        grad_compression=compression_build(averaging.grad_compression),
        state_averaging_compression=compression_build(averaging.state_compression),
        matchmaking_time=averaging.matchmaking_time, averaging_timeout=averaging.averaging_timeout,
        next_chunk_timeout=next_chunk_timeout(averaging.matchmaking_time, averaging.averaging_timeout),
        client_mode=setup.client_mode,
        grad_averager_factory=partial(FlooredGradientAverager, authorizer=setup.authorizer,
                                      aggregation=averaging.aggregation, **averager_opts),
        averager_opts=averager_opts,
        tracker_opts=dict(private_key=setup.private_key, max_refresh_period=setup.progress_refresh_s),
        # hivemind's round-by-round status at INFO: shown when the agent's --verbose lets hivemind's INFO through.
        load_state_timeout=state_download_timeout(model), verbose=True,
    )


def state_download_timeout(model: torch.nn.Module) -> float:
    """Seconds one attempt to download the swarm's state may take before hivemind tries again: the state
    (the parameters and LAMB's two moments, fp32) at 1 Mbit/s plus a minute, and never more than hivemind's
    own 600 s. hivemind 1.1.12's averager holds no reference to the task of a download it starts
    (``DecentralizedAverager._run_internal``), and asyncio keeps only weak ones: now and then the task is
    collected mid-download ("Task was destroyed but it is pending!"), and the attempt waits out its timeout.
    Seen in tests/peer_agent/test_nat_swarm.py: a trainer of a 4k-parameter model stuck at start until
    its test killed it 210 s later."""
    state_bits = 3 * 32 * sum(parameter.numel() for parameter in model.parameters())
    return min(600.0, 60.0 + state_bits / 1e6)
