"""Stepping real hivemind trainers together, each in its own thread, as the agent's swarm tests
(tests/peer_agent/) and the benchmarks (bench/equivalence.py) do."""

import json
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hivemind.averaging.allreduce import AllReduceRunner

from harness.pretraining import loss_evaluate
from peer_agent.data import batches, dataset_stream

STEP_TIME_S = 0.25  # stands in for compute, so the swarm's progress reads keep up as they would on real hardware
DEADLINE_S = 120


def train_together(trainers, epochs: int, *, step_time_s: float = STEP_TIME_S, deadline_s: float = DEADLINE_S,
                   after_step: Callable[[int, object, object], None] | None = None) -> list[list]:
    """Step every trainer until all reach local epoch ``epochs`` (or ``deadline_s`` passes); the step
    results of each. ``after_step(index, trainer, result)`` runs in the trainer's thread after each
    step. The first error of any thread is raised here."""
    results = [[] for _ in trainers]
    errors: list[BaseException] = []
    deadline = time.monotonic() + deadline_s

    def run(index, trainer):
        try:
            while min(t.optimizer.local_epoch for t in trainers) < epochs and time.monotonic() < deadline:
                time.sleep(step_time_s)
                result = trainer.step()
                results[index].append(result)
                trainer.progress()  # polls the swarm's throughput in the background
                if after_step is not None:
                    after_step(index, trainer, result)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(trainers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def train_measured(trainers, epochs: int, *, measured=None, **options) -> tuple[float, list[float], list[list]]:
    """:func:`train_together` (with ``options``) measured: the first trainer's :func:`fixed_loss` before, each
    of ``measured``'s (default: all) after, and the step results."""
    fixed = fixed_batches(trainers[0])
    before = fixed_loss(trainers[0], fixed)
    results = train_together(trainers, epochs=epochs, **options)
    return before, [fixed_loss(trainer, fixed) for trainer in measured or trainers], results


# The attacked swarm of tests/peer_agent/test_robust_aggregation.py and bench/swarm_spread.py: each peer
# gathers about 40 samples an epoch, enough that honest gradients agree in direction; and a longer round
# than the tests' default, since a sender that misses a chunk for next_chunk_timeout (a quarter of it) is
# dropped, and a part left with two slices has no majority to clip with.
ATTACK_EPOCHS = 6


def attack_options(aggregation: str) -> dict:
    """``harness.tiny_swarm.trainer_make``'s options for every peer of the attacked swarm."""
    return dict(averaging=dict(aggregation=aggregation, averaging_timeout=30.0), training=dict(target_batch_size=128))


def poison(trainer, factor: float = -100.0) -> None:
    """Make ``trainer`` an attacker: what it hands to the all-reduce is its gradient times ``factor``
    (after its own clipping, which an attacker would not do)."""
    step = trainer.optimizer.step

    def poisoned_step(*args, **kwargs):
        for parameter in trainer.model.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(factor)
        return step(*args, **kwargs)

    trainer.optimizer.step = poisoned_step


# What a global step does when it does not average this peer's gradients with the others'.
STEP_ANOMALIES = {
    "load_state_from_peers": "downloaded the swarm's state, dropping its gradients",
    "_load_local_gradients_into_optimizer": "stepped with its own gradients only",
    "_tag_along_with_zero_weight": "joined an averaging round with zero weight",
}


class PartialRounds(logging.Handler):
    """Counts the averaging rounds hivemind finished with parts missing, in every averager's process.

    A round whose part did not arrive in time on a loaded machine still succeeds: hivemind 1.1.12's
    reducer averages what it received ("Reducer: received 58.0% of input tensors") and a peer missing a
    result keeps its own values for it ("Averaging: received 88.0% results", hivemind/averaging/partition.py),
    so its group is whole and nothing else tells that the step was not an average of every peer's
    gradients (a CI run's equivalence test read one such step 2e-4 off the single-process curve). The
    averagers log in processes forked from this one: the handler, installed before they fork, counts in
    shared memory."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = multiprocessing.Value("q", 0)

    def emit(self, record: logging.LogRecord) -> None:
        if "received" in record.getMessage():
            with self.count.get_lock():
                self.count.value += 1


def partial_rounds_watch() -> PartialRounds:
    """This process's :class:`PartialRounds`, installed on hivemind's partition logger (once): call it before
    the trainers it should watch are made."""
    logger = logging.getLogger("hivemind.averaging.partition")
    for handler in logger.handlers:
        if isinstance(handler, PartialRounds):
            return handler
    handler = PartialRounds()
    logger.addHandler(handler)
    return handler


def optimizer_watch(trainer, *, on_anomaly: Callable[[str, int], None],
                    on_group: Callable[[list, int], None], partial_rounds: PartialRounds | None = None) -> None:
    """Observe how ``trainer``'s global steps go: ``on_anomaly(what, epoch)`` for each step that did not
    average its gradients with others (:data:`STEP_ANOMALIES`, and with ``partial_rounds``, a round
    finished with parts missing anywhere in this process's swarm since this peer's last one),
    ``on_group(peer_ids, epoch)`` with the group of each gradient round that succeeded. These wrap
    private hivemind 1.1.12 methods of the Optimizer (hivemind/optim/optimizer.py) on this one
    instance; they only observe."""
    optimizer = trainer.optimizer

    def noting(name: str, what: str) -> None:
        original = getattr(optimizer, name)

        def wrapper(*args, **kwargs):
            on_anomaly(what, optimizer.local_epoch)
            return original(*args, **kwargs)

        setattr(optimizer, name, wrapper)

    for name, what in STEP_ANOMALIES.items():
        noting(name, what)
    average = optimizer._average_gradients_and_load_into_optimizer

    partial_seen = [partial_rounds.count.value if partial_rounds else 0]

    def averaged(control):
        epoch = optimizer.local_epoch
        average(control)
        if control is not None and control.done() and not control.cancelled() and control.exception() is None:
            on_group(list(control.result()), epoch)
        if partial_rounds is not None and partial_rounds.count.value != partial_seen[0]:
            partial_seen[0] = partial_rounds.count.value
            on_anomaly("averaged with parts missing", epoch)

    optimizer._average_gradients_and_load_into_optimizer = averaged


def averaging_rounds_recorder(record: Path) -> type:
    """An ``AllReduceRunner`` class that appends each averaging round it runs to ``record`` (JSON lines:
    ``kind``, "gradients" or "parameters", the peers, their fractions of the vector and their modes), for
    ``peer_agent.aggregation.RUNNERS``. Averagers fork from the test's process, so each peer's averager
    writes its own line."""
    kinds = {"_grad_averager": "gradients", "_state_averager": "parameters"}

    class RecordingRunner(AllReduceRunner):
        def __init__(self, *args, peer_fractions, ordered_peer_ids, prefix, modes=None, **kwargs):
            kind = next((kind for suffix, kind in kinds.items() if prefix.endswith(suffix)), None)
            if kind is not None:
                with record.open("a") as file:
                    file.write(json.dumps(dict(kind=kind, fractions=list(peer_fractions),
                                               peers=[str(p) for p in ordered_peer_ids],
                                               modes=[mode.value for mode in modes or ()])) + "\n")
            super().__init__(*args, peer_fractions=peer_fractions, ordered_peer_ids=ordered_peer_ids, prefix=prefix,
                             modes=modes, **kwargs)

    return RecordingRunner


def assert_steps_counted(results: list[list], samples: int = 4) -> None:
    """Every step of ``train_together``'s results counted its ``samples``, but the few hivemind dropped
    (it found the peer out of sync and downloaded the swarm's state instead: 0 samples, not skipped)."""
    steps = [result for peer in results for result in peer]
    assert all(result.samples in (0, samples) and not result.skipped for result in steps)
    dropped = sum(result.samples == 0 for result in steps)
    assert dropped <= len(steps) // 10, f"{dropped} of {len(steps)} steps dropped"


def fixed_batches(trainer, count: int = 8, seed: int = 12345) -> list:
    """``count`` batches of the trainer's run data, drawn and masked the same way every time: what
    :func:`fixed_loss` measures the model on. The loss of a run's own training steps is measured on
    each step's fresh batch, with gradients a step stale when updates are delayed: between the first
    and last few steps it moves by as much as the training does over a test's few epochs."""
    config = trainer.setup.config
    stream = dataset_stream(config, data_files=trainer.setup.data_files, seed=seed)
    drawn = batches(trainer.tokenizer, config, stream, config.training.per_device_batch_size * 4, seed=seed)
    return [next(drawn) for _ in range(count)]


def fixed_loss(trainer, fixed: list) -> float:
    """The model's mean loss over ``fixed`` (from :func:`fixed_batches`), each measured on a copy in eval
    mode (``harness.pretraining.loss_evaluate``), so the trainer's own model is left as it is."""
    return sum(loss_evaluate(trainer.model, batch) for batch in fixed) / len(fixed)
