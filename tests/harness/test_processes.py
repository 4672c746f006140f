"""Killing processes forked from the test's own process (harness/processes.py): hivemind's cross-process
locks are shared with them, and a process killed while holding one would hold it for good."""

import multiprocessing
import time

from harness.processes import hivemind_locks_held


def _sender(lock, started) -> None:
    """What a hivemind DHT process does all day: take the lock, send, let go."""
    started.set()
    while True:
        with lock:
            time.sleep(0.005)
        time.sleep(0.0005)


def test_a_process_killed_while_the_locks_are_held_leaves_them_free():
    from hivemind.utils.mpfuture import MPFuture

    lock = MPFuture._update_lock
    context = multiprocessing.get_context("fork")
    for _ in range(5):  # the sender holds the lock nearly all the time: a bare kill would nearly always leave it held
        started = context.Event()
        sender = context.Process(target=_sender, args=(lock, started), daemon=True)
        sender.start()
        assert started.wait(10)
        time.sleep(0.1)
        with hivemind_locks_held(timeout=10):
            sender.kill()
            sender.join(10)
        assert lock.acquire(timeout=1), "the killed process left the lock held"
        lock.release()
