"""Checkpoints of a run: the coordinator's checkpointer downloads the collaboration's state from the
peers, saves it as a Hugging Face checkpoint zipped into media, and retention keeps the last few
and every n-th for good."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.core.files import File
from django.db import close_old_connections, transaction
from django.db.models import Sum

from peer_agent.checkpoint import (
    CheckpointMetadata,
    checkpoint_unzip,
    checkpoint_weights_load,
    checkpoint_write,
    checkpoint_zip,
)
from peer_agent.metrics import LocalMetrics, metrics_read
from peer_agent.model import model_build
from peer_agent.optim import parameter_groups
from peer_agent.protocol import AveragingConfig
from peer_agent.tokenizer import tokenizer_load
from peer_agent.training import lamb_factory, schedule_factory
from portal.metrics import CHECKPOINT_FAILURES, CHECKPOINTS_SAVED
from runs.models import Checkpoint, ContributionEvent, Evaluation, Run
from runs.swarm.cards import model_card_write
from runs.swarm.monitor import progress_read
from runs.swarm.state import BoundedSourceStateAverager

if TYPE_CHECKING:
    from hivemind.dht import DHT
    from hivemind.optim.state_averager import TrainingStateAverager
    from transformers import AlbertForPreTraining, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

CHECK_PERIOD_S = 15.0  # how often the checkpointer reads the swarm's epoch
RETRY_PERIOD_S = 60.0  # after a failed or fruitless attempt (no peer online to download from)
STATE_DOWNLOAD_TIMEOUT_S = 600.0
# A source silent this long between two parts of its state is given up. hivemind's default (its request
# timeout, 3 s) gave up at every stall of a volunteer's busy uplink: at sahajBERT's size four of five
# checkpoints failed after 3 to 172 s of a 217 MB download, each started again a minute later on the same
# uplink (docs/benchmarks.md section 28). The validator's holder allows 10 s (runs/swarm/spotcheck.py); a
# checkpoint, due every half hour, may wait longer.
STATE_CHUNK_TIMEOUT_S = 30.0

# hivemind fast-forwards the schedule to the downloaded epoch without an optimizer step; torch
# mistakes that for calling the scheduler and the optimizer in the wrong order.
warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")


@dataclass(frozen=True)
class CheckpointPolicy:
    """When to checkpoint and what to keep, from the run's averaging config (editable mid-run)."""

    every_epochs: int | None
    every_minutes: float | None
    keep_last: int
    keep_every_nth: int | None

    @classmethod
    def of(cls, averaging: AveragingConfig) -> CheckpointPolicy:
        return cls(every_epochs=averaging.checkpoint_every_epochs, every_minutes=averaging.checkpoint_every_minutes,
                   keep_last=averaging.keep_last_checkpoints, keep_every_nth=averaging.keep_every_nth_checkpoint)

    def due(self, *, swarm_epoch: int, last_epoch: int, seconds_since_last: float) -> bool:
        """Whether the swarm has moved far enough, in epochs or in time, since the last checkpoint."""
        if swarm_epoch <= last_epoch:
            return False  # nothing new to save
        if self.every_epochs is not None and swarm_epoch - last_epoch >= self.every_epochs:
            return True
        return self.every_minutes is not None and seconds_since_last >= self.every_minutes * 60

    def kept_for_good(self, number: int) -> bool:
        return self.keep_every_nth is not None and number % self.keep_every_nth == 0


@dataclass(frozen=True)
class SwarmReading:
    epoch: int  # the newest collaboration epoch a peer published metrics for
    loss: float | None  # the mean loss those peers published



def checkpoint_number(checkpoint: Checkpoint) -> int:
    """The checkpoint's sequence number in its run (1 for the first ever saved); see ``Checkpoint.number``."""
    return checkpoint.number


def checkpoints_to_delete(checkpoints: list[Checkpoint], *, keep_last: int) -> list[Checkpoint]:
    """Those that retention removes: neither among the newest ``keep_last`` nor kept for good."""
    newest_first = sorted(checkpoints, key=lambda checkpoint: checkpoint.epoch, reverse=True)
    return [checkpoint for checkpoint in newest_first[keep_last:] if not checkpoint.kept]


def checkpoint_retention_apply(*, run: Run, policy: CheckpointPolicy) -> list[int]:
    """Delete the run's checkpoints that retention no longer keeps, files first; their epochs. One
    being evaluated waits for a later pass (runs/evaluation/services.py claims it before starting)."""
    doomed = checkpoints_to_delete(list(run.checkpoints.all()), keep_last=policy.keep_last)
    evaluating = set(Evaluation.objects.filter(checkpoint__in=doomed, mlm_accuracy=None, error="")
                     .values_list("checkpoint_id", flat=True))
    doomed = [checkpoint for checkpoint in doomed if checkpoint.pk not in evaluating]
    for checkpoint in doomed:
        checkpoint.file.delete(save=False)
        checkpoint.delete()
    return [checkpoint.epoch for checkpoint in doomed]


def checkpoint_save(*, run: Run, directory: Path, metadata: CheckpointMetadata, policy: CheckpointPolicy) -> Checkpoint:
    """Zip a checkpoint directory, with its model card, into media as the run's next checkpoint, then
    apply retention."""
    newest = run.checkpoints.first()
    number = (checkpoint_number(newest) if newest else 0) + 1
    checkpoint = Checkpoint(run=run, epoch=metadata.epoch, loss=metadata.loss, samples=metadata.samples,
                            kept=policy.kept_for_good(number))
    model_card_write(run=run, checkpoint=checkpoint, directory=directory)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "checkpoint.zip"
        checkpoint_zip(directory, archive)
        checkpoint.size = archive.stat().st_size
        with archive.open("rb") as content, transaction.atomic():
            checkpoint.file.save(f"{run.hivemind_run_id}/{number:06d}-epoch{metadata.epoch}.zip", File(content), save=False)
            checkpoint.save()
    CHECKPOINTS_SAVED.labels(run=run.slug).inc()
    checkpoint_retention_apply(run=run, policy=policy)
    return checkpoint


def run_samples_total(*, run: Run) -> int:
    """Samples the run's volunteers have reported, all sessions together."""
    return ContributionEvent.objects.filter(session__run=run).aggregate(total=Sum("samples"))["total"] or 0


def swarm_read(dht: DHT, run_id: str) -> SwarmReading | None:
    """The collaboration's epoch and loss from the signed metrics of the peers in the swarm now; None
    when none published any."""
    return swarm_reading_of(metrics_read(dht, run_id), present=progress_read(dht, run_id).keys())


def swarm_reading_of(metrics: dict[bytes, LocalMetrics], *, present: Iterable[bytes]) -> SwarmReading | None:
    """The epoch that half the ``present`` peers (those with a progress record, by owner subkey) have
    reached (the lower median of their metrics' steps), and their mean loss there: each peer signs only
    its own records, so one member announcing a far epoch moves neither, while the swarm moving on
    moves both.

    A peer that left keeps its last metrics record for ``METRICS_EXPIRATION_S`` (10 minutes), but its
    progress record goes within a minute (hivemind clears it on shutdown). After a pause every agent
    joins again with a new peer key: counting the old sessions' records would hold the reading at their
    last step while the new peers moved past it, and the checkpointer would refuse those peers' states
    as too far ahead until the old records expired.
    """
    present = set(present)
    records = [record for subkey, record in metrics.items() if subkey in present]
    if not records:
        return None
    steps = sorted(record.step for record in records)
    epoch = steps[(len(steps) - 1) // 2]
    losses = [record.loss for record in records if record.step == epoch] or [record.loss for record in records]
    return SwarmReading(epoch=epoch, loss=sum(losses) / len(losses))


def state_epoch_trusted(*, state_epoch: int, swarm_epoch: int) -> bool:
    """Whether a downloaded state's epoch is one the swarm could be in: at most one past its reading
    (a peer may have stepped since). A member serving a state with a far epoch would otherwise make
    it the run's newest checkpoint, and no later checkpoint would ever be due."""
    return state_epoch <= swarm_epoch + 1


class Checkpointer:
    """Saves one run's checkpoints; its backbone peer calls :meth:`tick` on every heartbeat.

    A tick returns at once: reading the swarm, downloading its state and saving happen in a thread
    of their own, one at a time. The state comes from a ``TrainingStateAverager`` built like the
    peers' ``hivemind.Optimizer`` state (same parameters, LAMB and schedule, so the tensors line up)
    in client mode: it downloads, never shares its state or joins an averaging round.
    """

    def __init__(self, *, run_pk: int, run_id: str, slug: str, dht: DHT, check_period: float = CHECK_PERIOD_S,
                 retry_period: float = RETRY_PERIOD_S) -> None:
        self.run_pk, self.run_id, self.slug, self.dht = run_pk, run_id, slug, dht
        self.check_period, self.retry_period = check_period, retry_period
        self.started_at = time.time()
        self._next_check = 0.0
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()  # the averager is built, used and shut down by one thread at a time
        self._averager: TrainingStateAverager | None = None
        self._model: AlbertForPreTraining | None = None
        self._tokenizer: PreTrainedTokenizerFast | None = None
        self._closed = False

    def tick(self) -> None:
        """Start a look at the swarm in the background, unless one is running or it is too early.

        Call it from the main thread: the first tick starts the state averager's process, and
        hivemind sets signal handlers when it does, which only the main thread may.
        """
        if self._closed or (self._worker and self._worker.is_alive()) or time.monotonic() < self._next_check:
            return
        if self._averager is None:
            try:
                run = Run.objects.get(pk=self.run_pk)
                if run.tokenizer_status != Run.TokenizerStatus.READY:  # the model's vocabulary is not known yet
                    self._next_check = time.monotonic() + self.retry_period
                    return
                self._averager_build(run)
            except Exception:
                CHECKPOINT_FAILURES.labels(run=self.slug).inc()
                logger.exception("run %s: cannot prepare checkpoints; trying again in %.0f s", self.slug, self.retry_period)
                self._next_check = time.monotonic() + self.retry_period
                return
        self._worker = threading.Thread(target=self._check, name=f"checkpointer {self.slug}", daemon=True)
        self._worker.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self._closed = True
        if self._worker:
            self._worker.join(timeout)
        with self._lock:
            if self._averager is not None:
                self._averager.shutdown()
                self._averager = None

    @property
    def ready(self) -> bool:
        """Whether the model and state averager are built (on the first tick once the run's tokenizer is ready)."""
        return self._averager is not None and not self._closed

    def state_download_from(self, peer: str, *, timeout: float, silence: float,
                            kept: tuple[int, str] | None = None) -> tuple[int, list] | str | None:
        """The parameters of the state ``peer`` serves now (or, with ``kept``, the parameters it kept for
        that epoch and parameters' sketch): its epoch and its parameters (in the model's order), for the
        validator (runs/swarm/spotcheck.py), which compares several peers' states. None once shut down,
        or when the peer sent none or one of another shape; ``UNREACHABLE`` when no
        stream to the peer could be opened. It takes no lock: the averager answers
        requests from several threads, and a checkpoint's download does not hold it up."""
        averager = self._averager
        if averager is None or self._closed:
            return None
        served = averager.state_download_from(peer, timeout=timeout, silence=silence, kept=kept)
        if not isinstance(served, tuple):
            return served
        metadata, tensors = served
        epoch = metadata.get("epoch")
        position = {id(parameter): index for index, parameter in enumerate(averager.main_parameters)}
        parameters = []
        for parameter in self._model.parameters():
            index = position[id(parameter)]
            if index >= len(tensors) or tensors[index].shape != parameter.shape:
                return None
            parameters.append(tensors[index].float())
        return (epoch, parameters) if isinstance(epoch, int) and epoch >= 0 else None

    @property
    def tokenizer(self) -> PreTrainedTokenizerFast | None:
        return self._tokenizer

    @property
    def parameter_count(self) -> int:
        """The model's parameters, 0 before it is built: the validator bounds a state's download by its size."""
        return sum(parameter.numel() for parameter in self._model.parameters()) if self._model is not None else 0

    def _check(self) -> None:
        wait = self.check_period
        try:
            close_old_connections()
            wait = self._checkpoint_if_due()
        except Exception:  # the coordinator keeps serving the run; the next attempt may succeed
            CHECKPOINT_FAILURES.labels(run=self.slug).inc()
            logger.exception("run %s: checkpoint failed; trying again in %.0f s", self.slug, self.retry_period)
            wait = self.retry_period
        finally:
            close_old_connections()
            self._next_check = time.monotonic() + wait

    def _checkpoint_if_due(self) -> float:
        """One look at the swarm, and a checkpoint when it is due; returns the seconds until the next look."""
        run = Run.objects.get(pk=self.run_pk)
        policy = CheckpointPolicy.of(run.configuration.averaging)
        reading = swarm_read(self.dht, self.run_id)
        if reading is None:
            return self.check_period
        # A checkpoint saved from a state past the swarm (before states were checked) must not block the later ones.
        # The run's start (epoch 0, runs/setup/start.py) was made while drafting: time counts from this process's start.
        newest = run.checkpoints.filter(epoch__gt=0, epoch__lte=reading.epoch + 1).first()
        last_epoch = newest.epoch if newest else 0
        last_at = newest.created_at.timestamp() if newest else self.started_at
        if not policy.due(swarm_epoch=reading.epoch, last_epoch=last_epoch,
                                             seconds_since_last=time.time() - last_at):
            return self.check_period
        logger.info("run %s: checkpoint due at epoch %d; downloading the collaboration's state", self.slug, reading.epoch)
        with self._lock:
            if self._closed:
                return self.check_period
            self._averager.load_state_from_peers(max_epoch=reading.epoch + 1, timeout=STATE_DOWNLOAD_TIMEOUT_S)
            epoch = self._averager.local_epoch
            if not state_epoch_trusted(state_epoch=epoch, swarm_epoch=reading.epoch):
                logger.warning("run %s: refused a state of epoch %d, past the swarm's epoch %d; trying again in %.0f s",
                               self.slug, epoch, reading.epoch, self.retry_period)
                return self.retry_period
            if epoch <= last_epoch:
                logger.info("run %s: no peer shared a state newer than epoch %d; trying again in %.0f s",
                            self.slug, last_epoch, self.retry_period)
                return self.retry_period
            metadata = CheckpointMetadata(run_id=self.run_id, epoch=epoch, loss=reading.loss,
                                          samples=run_samples_total(run=run), time=time.time())
            with tempfile.TemporaryDirectory() as scratch:
                directory = Path(scratch) / "checkpoint"
                checkpoint_write(directory, model=self._model, tokenizer=self._tokenizer,
                                 optimizer_state=self._averager.optimizer.state_dict(), metadata=metadata)
                checkpoint = checkpoint_save(run=run, directory=directory, metadata=metadata, policy=policy)
        logger.info("run %s: saved checkpoint of epoch %d (%.1f MB%s)", self.slug, checkpoint.epoch,
                    checkpoint.size / 1e6, ", kept for good" if checkpoint.kept else "")
        return self.check_period

    def _averager_build(self, run: Run) -> None:
        """The model, tokenizer and state averager that downloads into them, built once per run."""
        config = run.configuration
        self._tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
        # The agents' initial weights (peer_agent.training.Trainer): until a peer serves a state, the
        # validator (runs/swarm/spotcheck.py) checks epoch 0 against them.
        self._model = model_build(config, len(self._tokenizer), pad_token_id=self._tokenizer.pad_token_id,
                                  init_seed=zlib.crc32(self.run_id.encode()))
        start = run.checkpoints.filter(epoch=0).first()  # the run's start (runs/setup/start.py): the agents load it
        if start is not None:
            with tempfile.TemporaryDirectory() as scratch:
                checkpoint_weights_load(checkpoint_unzip(Path(start.file.path), Path(scratch)), model=self._model)
        training = config.training
        self._averager = BoundedSourceStateAverager(
            dht=self.dht, prefix=f"{self.run_id}_state_averager",  # the prefix hivemind.Optimizer gives it
            params=parameter_groups(self._model, training.weight_decay),
            optimizer=lamb_factory(training), scheduler=schedule_factory(training),
            offload_optimizer=True, custom_gradients=True, client_mode=True, next_chunk_timeout=STATE_CHUNK_TIMEOUT_S,
            start=True,
        )
