"""Watching a swarm's rounds from the test's process (harness/swarm.py): hivemind's averagers log in
processes forked from it."""

import logging
import multiprocessing

from harness.swarm import partial_rounds_watch


def _averager_logs(message: str) -> None:
    """What hivemind 1.1.12's partition module logs in an averager's process (hivemind/averaging/partition.py)."""
    logging.getLogger("hivemind.averaging.partition").warning(message)


def test_a_round_finished_with_parts_missing_in_a_forked_averager_is_counted_here():
    rounds = partial_rounds_watch()
    assert partial_rounds_watch() is rounds, "installed once"
    before = rounds.count.value
    context = multiprocessing.get_context("fork")  # as hivemind starts its averagers on Linux
    for message in ("Reducer: received 58.0% of input tensors", "Averaging: received 88.0% results",
                    "Averaging: the round took 3 s"):
        process = context.Process(target=_averager_logs, args=(message,))
        process.start()
        process.join(30)
        assert process.exitcode == 0
    assert rounds.count.value - before == 2, "the two partial rounds, not the other warning"
