"""Cleaning up the processes real hivemind peers leave behind (DHT, averagers, p2pd), for the
tests and the benchmarks alike."""

from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil
from hivemind.utils.mpfuture import MPFuture, SharedBytes


def children_reap() -> None:
    """Terminate, then kill, every child process of this process (a test's or a benchmark's), except torch's
    shared-memory manager: hivemind switches torch to the "file_system" sharing strategy, and
    tensors freed later in this process still need the manager (killing it aborts the
    interpreter with "Broken pipe")."""
    children = [child for child in psutil.Process().children(recursive=True) if _name(child) != "torch_shm_manager"]
    _, alive = psutil.wait_procs(children, timeout=2)
    with hivemind_locks_held():
        for child in alive:
            with suppress(psutil.NoSuchProcess):
                child.terminate()
        _, alive = psutil.wait_procs(alive, timeout=5)
        for child in alive:
            with suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(alive, timeout=5)


@contextmanager
def hivemind_locks_held(timeout: float = 30.0) -> Iterator[None]:
    """Hold hivemind's cross-process locks (MPFuture's, made when hivemind is imported) while processes forked
    from this one are killed. Every process forked from this one shares them: one killed while it held a lock
    holds it for good, and every later future of the process tree waits on it without end (CI36: the DHT of a
    test's second coordinator never reported ready, its process stuck in ``MPFuture.set_result``). A lock
    not had within ``timeout`` is held by a process gone already; the kill goes on."""
    held = []
    try:
        for lock in (SharedBytes._lock, MPFuture._update_lock):
            if lock.acquire(timeout=timeout):
                held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""
