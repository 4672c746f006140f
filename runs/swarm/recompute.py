"""Recomputing committed steps: the part of a spot check that costs compute, and the validator workers that
do it when a run needs more than its coordinator's host (docs/deploy.md, "Validator workers").

The coordinator's validator (runs/swarm/spotcheck.py) holds each epoch's state and decides which states a
commitment is checked against. With ``SPOT_CHECK_WORKERS`` off it recomputes in its own check thread; with it
on it only schedules: it writes the states to the media storage (``spot-check-states/<run>/``, named by
their content) and queues :func:`spot_check_task` on the ``validations`` queue, which any number of
workers on other machines consume. Either way :class:`Recomputer` draws the steps, replays their
micro-batches, recomputes them and records the outcome; a commitment is recorded once, whichever worker
or retry gets to it first (:func:`outcome_record`).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import logging
import secrets
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch
from celery import shared_task
from celery.signals import worker_shutdown, worker_shutting_down
from celery.utils.nodenames import worker_direct
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from peer_agent.join import exit_at_once
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig
from peer_agent.spotcheck import BatchReplay, Sketch, data_seed, fingerprint_distance, fingerprint_encode, step_fingerprint
from peer_agent.tokenizer import tokenizer_load
from runs.credit import verification
from runs.models import Run, StepCommitment, TrainingSession

logger = logging.getLogger(__name__)

# How far apart two downloads of one state may be: states travel in fp16 (rounding by at most 5e-4),
# while one optimizer step moves parameters by about the learning rate (LAMB scales it by each layer's norm).
# A session whose step was computed further than this from the held state trained elsewhere.
STATE_AGREEMENT = 1e-3
# How far a step's claimed parameters may be from the state it is recomputed at for a mismatch to count as
# faked: the wire's fp16 rounding (about 3e-4 relative) and the sketch's own error. A step claimed further
# off, though within STATE_AGREEMENT, may have been computed at a state the validator never held, one step
# away: late in a run a step that small moves the gradient by more than the tolerance (a demo agent's
# honest step recomputed 0.104 away beside a held state). Such a step diverged: its epoch earns nothing,
# and nothing is held against the session.
STATE_EXACT = 5e-4
REPLAYS_KEPT = 256  # sessions whose streams stay where the last check left them; others replay from the start
STATES_FOLDER = "spot-check-states"
RUNS_KEPT = 4  # runs a validator worker keeps a model and the sessions' streams of
STATES_KEPT = 8  # states a validator worker keeps loaded: a few epochs' worth, for the checks queued together
# How long a session's checks go to the validator worker that took its last one (TrainingSession.validator_worker):
# that worker reads the session's stream on from where its last check left it, where another would replay it from
# the start. Each worker replayed every session's stream, and two workers checked no faster than one
# (docs/benchmarks.md section 27). A worker that stopped, or fell this far behind, gives its sessions up.
SESSION_KEPT_S = 120.0
_random = secrets.SystemRandom()


class CheckHandedBack(Exception):  # noqa: N818 - it is an outcome, not a fault
    """A validator worker was asked to stop in the middle of a check: the check goes back to the coordinator."""


class Recomputer:
    """One run's recomputation: its model (built at the first check) and each session's data stream, read
    forwards from where its last check left it."""

    def __init__(self, *, run_id: str, slug: str, tokenizer, stopping: threading.Event | None = None) -> None:
        self.run_id, self.slug, self.tokenizer = run_id, slug, tokenizer
        self.stopping = stopping  # once set, a check stops at its next micro-batch (CheckHandedBack)
        self._model = None
        self._replays: dict[int, BatchReplay] = {}  # session -> its stream, least recently used first

    def check(self, run: Run, config: RunConfig, commitment: StepCommitment, states: Sequence[list],
              sketches: list[str] | None = None) -> str | None:
        """Check ``commitment`` against ``states`` (their sketches for its epoch, when the caller has them)
        and record the outcome; None when another check recorded it first."""
        sketches = sketches or [state_sketch(self.run_id, commitment.epoch, state) for state in states]
        replay = self._replay(run, config, commitment)
        steps = commitment.steps
        # cursor -> distance to the nearest held state; step index -> the held states it may have been
        # computed at, nearest first (a sketch tells apart states 1e-3 apart, not closer ones)
        diverged, computed_at, claimed_apart = {}, {}, {}
        for index, step in enumerate(steps):
            claimed = step_parameters(steps, index)
            apart = [fingerprint_distance(claimed, sketch) if claimed is not None else 0.0 for sketch in sketches]
            near = sorted((state for state in range(len(states)) if apart[state] <= STATE_AGREEMENT),
                          key=apart.__getitem__)
            if near:
                computed_at[index], claimed_apart[index] = near, apart[near[0]]
            else:
                diverged[step[0]] = min(apart)
        at_state = sorted(computed_at)
        # Drawn now, after the commitment, with the operating system's randomness (runs/swarm/spotcheck.py).
        drawn = [at_state[index] for index in steps_draw([steps[index][1] for index in at_state],
                                                          config.verification.checks_per_epoch)]
        # The stream is read forwards only (going back replays it from the start); each state is loaded once.
        micro_batches = {index: replay.micro_batches(steps[index][0], max(1, steps[index][1] // commitment.micro_batch_size),
                                                     before_each=self._stop_if_asked)
                         for index in sorted(drawn)}
        distances, loaded = {}, None
        for index in sorted(drawn, key=computed_at.__getitem__):
            # The nearest state first; a step that does not recompute there is tried at the others its
            # sketch cannot tell apart, and fails only if it recomputes at none.
            for state in computed_at[index]:
                self._stop_if_asked()
                if state != loaded:
                    loaded = state
                    self._state_load(config, states[state])
                recomputed = step_fingerprint(self._model, micro_batches[index], self.run_id, commitment.epoch)
                distance = fingerprint_distance(steps[index][2], recomputed)
                distances[steps[index][0]] = min(distance, distances.get(steps[index][0], distance))
                if distance <= config.verification.tolerance:
                    break
            cursor = steps[index][0]
            if distances[cursor] > config.verification.tolerance and claimed_apart[index] > STATE_EXACT:
                diverged[cursor] = claimed_apart[index]
                del distances[cursor]
        outcome = outcome_record(commitment=commitment, distances=dict(sorted(distances.items())), diverged=diverged,
                                 config=config)
        logger.info("run %s: spot check of session %d, epoch %d: %s (%s)", self.slug, commitment.session_id,
                    commitment.epoch, outcome or "recorded by another check",
                    ", ".join(f"{cursor}: {distance:.4f}" for cursor, distance in sorted(distances.items())) +
                    (f"; {len(diverged)} micro-batches computed off the held states" if diverged else ""))
        return outcome

    def _stop_if_asked(self) -> None:
        if self.stopping is not None and self.stopping.is_set():
            raise CheckHandedBack

    def _replay(self, run: Run, config: RunConfig, commitment: StepCommitment) -> BatchReplay:
        session_id = commitment.session_id
        replay = self._replays.pop(session_id, None)  # put back last: the dict runs from least to most recently used
        if replay is not None:
            self._replays[session_id] = replay
        if replay is None or replay.micro_batch_size != commitment.micro_batch_size:
            data = config.model_copy(update={"data": config.data.model_copy(
                update={"shuffle_buffer": commitment.shuffle_buffer})})
            files = [data_file.file.path for data_file in run.data_files.all()] if config.data.source == "files" else None
            replay = self._replays[session_id] = BatchReplay(
                data, self.tokenizer, seed=data_seed(self.run_id, session_id),
                micro_batch_size=commitment.micro_batch_size, data_files=files)
            while len(self._replays) > REPLAYS_KEPT:
                del self._replays[next(iter(self._replays))]
        return replay

    def _state_load(self, config: RunConfig, state: list) -> None:
        """Load ``state`` into the model (built at the first use, as the coordinator builds the run's)."""
        if self._model is None:
            self._model = model_build(config, len(self.tokenizer), pad_token_id=self.tokenizer.pad_token_id,
                                      init_seed=zlib.crc32(self.run_id.encode()))
        with torch.no_grad():
            for param, value in zip(self._model.parameters(), state, strict=True):
                param.copy_(value)


def outcome_record(*, commitment: StepCommitment, distances: dict[int, float], diverged: dict[int, float],
                   config: RunConfig) -> str | None:
    """Record a check's figures unless the commitment was decided meanwhile: a check queued again after a
    worker was lost may run beside the first (:func:`spot_check_task`), and only one may count."""
    with transaction.atomic():
        if not StepCommitment.objects.select_for_update().filter(
                pk=commitment.pk, outcome=StepCommitment.Outcome.PENDING).exists():
            return None
        return verification.check_record(
            commitment=commitment, distances=distances, diverged=diverged, tolerance=config.verification.tolerance,
            failures_to_suspend=config.verification.failures_to_suspend)


def state_sketch(run_id: str, epoch: int, state: list) -> str:
    """The parameters' sketch of ``state`` for ``epoch``'s cells, as a step's claim carries it."""
    return fingerprint_encode(Sketch(run_id, epoch, state).apply(state))


def state_name(*, run_pk: int, epoch: int, state: list) -> str:
    """Where ``state`` is kept for the checks of ``epoch``'s commitments: named by its content, so that a state
    is written once however many checks it serves."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in state:
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return f"{STATES_FOLDER}/{run_pk}/{epoch}-{digest.hexdigest()}.pt"


def state_write(name: str, state: list) -> None:
    if default_storage.exists(name):
        return
    buffer = io.BytesIO()
    torch.save([tensor.detach().cpu() for tensor in state], buffer)
    default_storage.save(name, ContentFile(buffer.getvalue()))


def state_read(name: str) -> list:
    with default_storage.open(name, "rb") as file:
        return torch.load(io.BytesIO(file.read()), weights_only=True)


def states_prune(*, run_pk: int, before_epoch: int) -> int:
    """Delete the kept states of epochs before ``before_epoch``: no queued check asks for them. Returns how many."""
    folder = f"{STATES_FOLDER}/{run_pk}"
    try:
        _, names = default_storage.listdir(folder)
    except FileNotFoundError:
        return 0
    old = [name for name in names if name.split("-", 1)[0].isdigit() and int(name.split("-", 1)[0]) < before_epoch]
    for name in old:
        default_storage.delete(f"{folder}/{name}")
    return len(old)


# A validator worker's own: each run's recomputer, and the states it read last (name -> state).
_recomputers: dict[tuple[int, str, str], Recomputer] = {}
_states: dict[str, list] = {}
_stopping = threading.Event()


def sessions_give_up(worker: str) -> None:
    """A stopped worker's sessions go to whichever worker takes their next check."""
    TrainingSession.objects.filter(validator_worker=worker).update(validator_worker="")


@worker_shutdown.connect
def _worker_stopped(sender, **kwargs) -> None:
    """Celery's warm shutdown is over by this signal: the worker gives its sessions up, and the process ends at once
    (peer_agent.join.exit_at_once), as the coordinator and the agent do. The interpreter's teardown of torch held a
    validator worker's exit past tests/test_process_stops.py's 10 s (10.5 s at load 13-17 beside a demo, its check
    handed back within 2.1 s), and past the demo's 15 s."""
    try:
        sessions_give_up(sender.hostname)
    finally:
        exit_at_once(sender.exitcode or 0)


@worker_shutting_down.connect
def _stop_asked(**kwargs) -> None:
    """SIGTERM or Ctrl-C: a warm shutdown waits for the running task, and a check may replay a session's stream
    for minutes. It hands its commitment back instead (:func:`spot_check_task`), so the worker stops within
    seconds, as every portal process does (tests/test_process_stops.py)."""
    _stopping.set()


def _recomputer_for(run: Run) -> Recomputer:
    key = (run.pk, run.hivemind_run_id, run.tokenizer_file.name)
    recomputer = _recomputers.pop(key, None) or Recomputer(
        run_id=run.hivemind_run_id, slug=run.slug, tokenizer=tokenizer_load(Path(run.tokenizer_file.path)),
        stopping=_stopping)
    _recomputers[key] = recomputer  # the most recently used last
    while len(_recomputers) > RUNS_KEPT:
        del _recomputers[next(iter(_recomputers))]
    return recomputer


class StoredStates(Sequence):
    """The states a queued check names, each read from the storage only when a drawn step needs it: the
    check names every state its epoch's steps may claim (a few per epoch and its neighbours, 72 MB each at
    sahajBERT's size), and recomputes at one or two of them."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index):
        return _state_for(self.names[index])


def _state_for(name: str) -> list:
    state = _states.pop(name, None)
    if state is None:
        state = state_read(name)
    _states[name] = state
    while len(_states) > STATES_KEPT:
        del _states[next(iter(_states))]
    return state


@shared_task(bind=True, acks_late=True, ignore_result=True)
def spot_check_task(self, commitment_pk: int, states: list[str], sketches: list[str] | None = None,
                    forwarded: bool = False) -> str | None:
    """On a validator worker: check a commitment against the states the coordinator kept for it (their names
    in the media storage, and their sketches for the commitment's epoch, which the coordinator computed
    already; a check queued by an older coordinator has none, and they are computed here), or pass it to the
    worker that checks its session (:func:`session_worker`), on that worker's own queue. Returns the outcome,
    None when there was nothing to record here."""
    commitment = StepCommitment.objects.select_related("session__run").filter(pk=commitment_pk).first()
    if commitment is None or commitment.outcome != StepCommitment.Outcome.PENDING or commitment.session.suspended_at:
        return None
    if self.request.hostname and not self.request.is_eager:  # on a worker, not called in its caller's process
        worker = session_worker(commitment.session_id, self.request.hostname, take=forwarded)
        if worker != self.request.hostname:
            spot_check_task.apply_async((commitment_pk, states, sketches, True), queue=worker_direct(worker))
            return None
    run = commitment.session.run
    config = run.configuration
    if not config.verification.spot_checks:
        return None
    try:
        return _recomputer_for(run).check(run, config, commitment, StoredStates(states), sketches)
    except FileNotFoundError:
        # Pruned meanwhile: the coordinator decides again, holding its states or marking the commitment unchecked.
        logger.warning("run %s: the states of session %d's epoch %d are gone; the check goes back to the coordinator",
                       run.slug, commitment.session_id, commitment.epoch)
    except CheckHandedBack:
        # Queued again at the coordinator's next cycle, for another worker or this one once it runs again.
        logger.info("run %s: stopping; the check of session %d's epoch %d goes back to the coordinator",
                    run.slug, commitment.session_id, commitment.epoch)
    StepCommitment.objects.filter(pk=commitment.pk).update(queued_at=None)
    return None


def session_worker(session_id: int, worker: str, *, take: bool = False) -> str:
    """The validator worker that checks the session's commitments: ``worker``, now theirs, unless another took one
    of them within SESSION_KEPT_S (or, with ``take``, whatever another did: a check passed on to ``worker`` once
    is checked there, never passed on again)."""
    now = timezone.now()
    free = Q(validator_worker=worker) | Q(validator_worker="") | Q(validator_worker_seen_at=None) | Q(
        validator_worker_seen_at__lt=now - datetime.timedelta(seconds=SESSION_KEPT_S))
    sessions = TrainingSession.objects.filter(pk=session_id)
    if (sessions if take else sessions.filter(free)).update(validator_worker=worker, validator_worker_seen_at=now):
        return worker
    return sessions.values_list("validator_worker", flat=True).first() or worker


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
