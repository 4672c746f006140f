"""Cleaning up the processes real hivemind peers leave behind (DHT, averagers, p2pd), for the
tests and the benchmarks alike."""

from contextlib import suppress

import psutil


def children_reap() -> None:
    """Terminate, then kill, every child process of this process (a test's or a benchmark's), except torch's
    shared-memory manager: hivemind switches torch to the "file_system" sharing strategy, and
    tensors freed later in this process still need the manager (killing it aborts the
    interpreter with "Broken pipe")."""
    children = [child for child in psutil.Process().children(recursive=True) if _name(child) != "torch_shm_manager"]
    _, alive = psutil.wait_procs(children, timeout=2)
    for child in alive:
        with suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(alive, timeout=5)
    for child in alive:
        with suppress(psutil.NoSuchProcess):
            child.kill()


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""
