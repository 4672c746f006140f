"""Stepping real hivemind trainers together, as the swarm tests of the agent do
(test_training_swarm.py, test_averaging_partners.py)."""

import threading
import time

STEP_TIME_S = 0.25  # stands in for compute, so the swarm's progress reads keep up as they would on real hardware
DEADLINE_S = 120


def train_together(trainers, epochs):
    """Step every trainer in its own thread until all reach ``epochs``; the step results of each."""
    results = [[] for _ in trainers]
    errors = []

    def run(index, trainer):
        try:
            deadline = time.monotonic() + DEADLINE_S
            while min(t.optimizer.local_epoch for t in trainers) < epochs and time.monotonic() < deadline:
                time.sleep(STEP_TIME_S)
                results[index].append(trainer.step())
                trainer.progress()  # polls the swarm's throughput in the background
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(trainers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
