"""Stepping real hivemind trainers together, each in its own thread, as the agent's swarm tests
(tests/peer_agent/) and the benchmarks (bench/equivalence.py) do."""

import threading
import time
from collections.abc import Callable

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
