"""The validator: recomputes steps that sessions committed to, and records whether they match.

Each run's validator (started by the coordinator next to its checkpointer, whose state averager it
shares) downloads the collaboration's parameters whenever the swarm enters a new epoch and holds
the last few (as many as the ingest accepts commitments for, runs/ingest/reports.py). For every
commitment of a held epoch (``runs.models.StepCommitment``, which arrives when a session has closed
the epoch) it compares the parameters each step says it was computed at with the held state's
(sketches: no recomputation), then draws ``verification.checks_per_epoch`` of the steps claimed at
the held state, each with a chance in proportion to its samples, with the operating system's
randomness and only now, after the commitment, so a peer cannot know in advance which steps will be
recomputed. It rebuilds their micro-batches from the run's data and the session's public seed
(``peer_agent.spotcheck.BatchReplay``), recomputes their gradients at the held parameters and
compares fingerprints; ``runs.swarm.verification`` turns the figures into credit decisions. A step
computed at other parameters (a peer whose averaging round failed steps alone and leaves the swarm's
parameters for an epoch or more) cannot be checked, and its epoch earns nothing, drawn or not.
Commitments of epochs the validator did not hold are marked unchecked, and earn nothing either.
docs/trust.md says what this proves and what it does not.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import zlib
from typing import TYPE_CHECKING

from django.db import close_old_connections

from peer_agent.protocol import RunConfig
from runs.ingest.reports import COMMITMENT_WINDOW_EPOCHS
from runs.models import Run, RunSample, StepCommitment
from runs.swarm import verification
from runs.swarm.checkpoints import Checkpointer, state_epoch_trusted

if TYPE_CHECKING:
    from hivemind.dht import DHT

    from peer_agent.spotcheck import BatchReplay

logger = logging.getLogger(__name__)

CHECK_PERIOD_S = 2.0  # how often the validator looks for new commitments
HOLD_PERIOD_S = 0.5  # how often it looks for a new state, to hold each epoch's state as the swarm enters it
# One download's bound: the holder downloads all the time, and the coordinator's stop waits for the download
# in progress (Checkpointer.shutdown takes its lock); a swarm whose peers left would otherwise hold it 600 s.
HOLD_DOWNLOAD_TIMEOUT_S = 10.0
# Epochs whose parameters are kept: every epoch the ingest still takes commitments for, and two more for
# a monitor reading that lags the swarm. Each state is a copy of the parameters (72 MB at sahajBERT's size).
HELD_EPOCHS = COMMITMENT_WINDOW_EPOCHS + 2

REPLAYS_KEPT = 256  # sessions whose streams stay where the last check left them; others replay from the start
# How far apart two downloads of one state may be: states travel in fp16 (rounding by at most 5e-4),
# while one optimizer step moves parameters by about the learning rate (LAMB scales it by each layer's norm).
# A session whose step was computed further than this from the held state trained elsewhere.
STATE_AGREEMENT = 1e-3
_random = secrets.SystemRandom()


def parameters_apart(first: list, second: list) -> float:
    """The distance between two copies of a model's parameters, relative to the second's size (0 for the same)."""
    difference = sum(float((a.double() - b.double()).pow(2).sum()) for a, b in zip(first, second, strict=True))
    size = sum(float(b.double().pow(2).sum()) for b in second)
    return (difference / max(size, 1e-24)) ** 0.5


class Validator:
    """Spot-checks one run's sessions; the coordinator calls :meth:`tick` on every heartbeat. The work
    happens in two threads of its own: one holds the swarm's state of each epoch as the swarm enters it
    (it looks every ``hold_period``), one checks the commitments of held epochs. Holding never
    waits behind checks: an epoch whose state is missed earns nothing for anyone (runs/swarm/verification.py),
    and a demo's epochs last a few seconds."""

    def __init__(self, *, run_pk: int, run_id: str, slug: str, dht: DHT, checkpointer: Checkpointer,
                 check_period: float = CHECK_PERIOD_S, hold_period: float = HOLD_PERIOD_S) -> None:
        self.run_pk, self.run_id, self.slug, self.dht = run_pk, run_id, slug, dht
        self.checkpointer, self.check_period, self.hold_period = checkpointer, check_period, hold_period
        self.held: dict[int, list] = {}  # epoch -> the collaboration's parameters in that epoch
        self._hold_spent = 0.0  # seconds the last try at holding a state took
        self._replays: dict[int, BatchReplay] = {}  # session -> its stream, advanced as checks go
        self._model = None
        self._tokenizer = None
        self._threads: dict[str, threading.Thread] = {}
        self._next_check = 0.0
        self._closed = False

    def tick(self) -> None:
        if self._closed or not self.checkpointer.ready:
            return
        # The holder keeps its own pace, not the coordinator's heartbeat (5 s): a demo's epochs are shorter.
        holder = self._threads.get("hold")
        if holder is None or not holder.is_alive():
            self._threads["hold"] = threading.Thread(target=self._holding, daemon=True, name=f"validator hold {self.slug}")
            self._threads["hold"].start()
        checker = self._threads.get("check")
        if (checker is None or not checker.is_alive()) and time.monotonic() >= self._next_check:
            self._threads["check"] = threading.Thread(target=self._cycle, daemon=True, name=f"validator {self.slug}")
            self._threads["check"].start()

    def shutdown(self, timeout: float = 5.0) -> None:
        # A check in progress ends within a step's recomputation; a download in progress is left to
        # its daemon thread, so the coordinator still stops within seconds (docs/deploy.md).
        self._closed = True
        for thread in self._threads.values():
            thread.join(timeout)

    def _cycle(self) -> None:
        try:
            close_old_connections()
            self.check_once()
        except Exception:  # the coordinator keeps serving the run; the next cycle may succeed
            logger.exception("run %s: spot checks failed this cycle", self.slug)
        finally:
            close_old_connections()
            self._next_check = time.monotonic() + self.check_period

    def _holding(self) -> None:
        while not self._closed:
            try:
                close_old_connections()
                self.hold_once()
            except Exception:  # the next try may succeed
                logger.exception("run %s: spot checks could not hold the swarm's state this time", self.slug)
            finally:
                close_old_connections()
            # Twice as long as the last try took: a large model's state takes seconds to download, and every
            # download is served by a training peer.
            time.sleep(max(self.hold_period, 2 * self._hold_spent))

    def _spot_checks_on(self) -> tuple[Run, RunConfig] | None:
        run = Run.objects.get(pk=self.run_pk)
        config = RunConfig.model_validate(run.config)
        return (run, config) if config.verification.spot_checks else None

    def hold_once(self) -> None:
        """Download the newest state the swarm serves and hold it if its epoch is new. Peers step into an
        epoch at their own moments and the monitor's reading is up to a heartbeat old, so the holder does
        not wait for a reading to move: it looks every ``hold_period`` (longer for a large state), and an
        epoch whose state is missed earns nothing. It calls no DHT method itself: hivemind's DHT takes
        calls through one pipe, and the monitor reads the DHT from the coordinator's thread."""
        if self._spot_checks_on() is None:
            return
        reading = RunSample.objects.filter(run_id=self.run_pk).order_by("-at").values_list("global_epoch", flat=True)
        swarm_epoch = reading.first()
        if swarm_epoch is None:
            return
        started = time.monotonic()
        self._hold(swarm_epoch + 1)  # the reading may be a heartbeat behind the peers
        self._hold_spent = time.monotonic() - started

    def check_once(self) -> int:
        """Check the commitments of held epochs; returns how many were checked."""
        spot_checks = self._spot_checks_on()
        if spot_checks is None or not self.held:
            return 0
        run, config = spot_checks
        held = dict(self.held)  # the holder adds and drops states meanwhile
        verification.commitments_uncheckable(run=run, before_epoch=min(held))
        checked = 0
        for commitment in verification.commitments_to_check(run=run, epochs=set(held)):
            if self._closed:
                break
            self._check(run, config, commitment, held[commitment.epoch])
            checked += 1
        return checked

    def _hold(self, swarm_epoch: int) -> None:
        """Download the swarm's state twice and hold it by its epoch if the two agree. One download is
        not enough: a peer counts its new epoch a moment before its optimizer step has run, so a state
        can carry the new epoch with the old parameters, and a peer whose averaging round failed holds
        parameters of its own. Held, such a state fails every honest check of its epoch; not held,
        the epoch's commitments are unchecked (docs/trust.md)."""
        started = time.monotonic()
        first = self.checkpointer.state_download(swarm_epoch=swarm_epoch, timeout=HOLD_DOWNLOAD_TIMEOUT_S)
        if first is None or first[0] in self.held:
            return  # nothing new: no second download
        second = self.checkpointer.state_download(swarm_epoch=swarm_epoch, timeout=HOLD_DOWNLOAD_TIMEOUT_S)
        if second is None:
            return
        logger.debug("run %s: two downloads of the swarm's state at epoch %d took %.1f s", self.slug, swarm_epoch,
                     time.monotonic() - started)
        epoch, parameters, self._tokenizer = second
        if not state_epoch_trusted(state_epoch=epoch, swarm_epoch=swarm_epoch):
            logger.warning("run %s: spot checks refused a state of epoch %d, past the swarm's %d", self.slug, epoch,
                           swarm_epoch)
            return
        apart = parameters_apart(first[1], parameters)
        if first[0] != epoch or apart > STATE_AGREEMENT:
            logger.info("run %s: two downloads of the swarm's state disagree (epochs %d and %d, parameters %.2g apart);"
                        " holding neither", self.slug, first[0], epoch, apart)
            return
        self.held[epoch] = parameters
        logger.debug("run %s: spot checks hold the state of epoch %d", self.slug, epoch)
        for old in sorted(self.held)[:-HELD_EPOCHS]:
            self.held.pop(old, None)

    def _check(self, run: Run, config: RunConfig, commitment: StepCommitment, state: list) -> None:
        import torch

        from peer_agent.model import model_build
        from peer_agent.spotcheck import (
            BatchReplay,
            data_seed,
            fingerprint_distance,
            parameters_fingerprint,
            step_fingerprint,
        )

        if self._model is None:
            self._model = model_build(config, len(self._tokenizer), pad_token_id=self._tokenizer.pad_token_id,
                                      init_seed=zlib.crc32(self.run_id.encode()))
        with torch.no_grad():
            for param, value in zip(self._model.parameters(), state, strict=True):
                param.copy_(value)
        session_id = commitment.session_id
        replay = self._replays.pop(session_id, None)  # put back last: the dict runs from least to most recently used
        if replay is not None:
            self._replays[session_id] = replay
        if replay is None or replay.micro_batch_size != commitment.micro_batch_size:
            data = config.model_copy(update={"data": config.data.model_copy(
                update={"shuffle_buffer": commitment.shuffle_buffer})})
            files = [data_file.file.path for data_file in run.data_files.all()] if config.data.source == "files" else None
            replay = self._replays[session_id] = BatchReplay(
                data, self._tokenizer, seed=data_seed(self.run_id, session_id),
                micro_batch_size=commitment.micro_batch_size, data_files=files)
            while len(self._replays) > REPLAYS_KEPT:
                del self._replays[next(iter(self._replays))]
        steps = commitment.steps
        held = parameters_fingerprint(self._model, self.run_id, commitment.epoch)
        diverged = {}
        for index, step in enumerate(steps):
            claimed = step_parameters(steps, index)
            apart = fingerprint_distance(claimed, held) if claimed is not None else 0.0
            if apart > STATE_AGREEMENT:
                diverged[step[0]] = apart
        at_state = [index for index, step in enumerate(steps) if step[0] not in diverged]
        distances = {}
        for index in steps_draw([steps[index][1] for index in at_state], config.verification.checks_per_epoch):
            cursor, samples, fingerprint = steps[at_state[index]][:3]
            micro_batches = replay.micro_batches(cursor, max(1, samples // commitment.micro_batch_size))
            recomputed = step_fingerprint(self._model, micro_batches, self.run_id, commitment.epoch)
            distances[cursor] = fingerprint_distance(fingerprint, recomputed)
        outcome = verification.check_record(
            commitment=commitment, distances=distances, diverged=diverged, tolerance=config.verification.tolerance,
            failures_to_suspend=config.verification.failures_to_suspend)
        logger.info("run %s: spot check of session %d, epoch %d: %s (%s)", self.slug, session_id, commitment.epoch,
                    outcome, ", ".join(f"{cursor}: {distance:.4f}" for cursor, distance in distances.items()) +
                    (f"; {len(diverged)} micro-batches computed off the held state" if diverged else ""))


def steps_draw(samples: list[int], k: int) -> list[int]:
    """``k`` distinct indices of ``samples`` (all of them when there are fewer), each draw with a chance in
    proportion to its samples among those not drawn yet: a step that claims many samples is as likely to
    be checked as the many small steps it stands for. Sorted, in stream order."""
    weights = dict(enumerate(samples))
    drawn = []
    while weights and len(drawn) < k:
        index = _random.choices(list(weights), weights=list(weights.values()))[0]
        drawn.append(index)
        del weights[index]
    return sorted(drawn)


def step_parameters(steps: list[list], index: int) -> str | None:
    """The parameters a session says the micro-batch at ``index`` of its stored commitment was computed
    at: those of its step's first micro-batch, the nearest before it that carries them (None from agents
    before 0.9.0)."""
    for step in reversed(steps[:index + 1]):
        if len(step) > 3:
            return step[3]
    return None
