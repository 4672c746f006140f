"""Processes the tests start and end themselves: a DHT peer on loopback, a forked child that
sleeps, a redis-server. (Reaping what hivemind leaves behind, which the benchmarks do too, is
harness/processes.py's `children_reap`.)"""

import contextlib
import multiprocessing
import random
import socket
import subprocess
import time
from pathlib import Path

import psutil
import redis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def restartable_port() -> int:
    """A free loopback port below the kernel's ephemeral range: while a server is down, no other
    process's outgoing connection can take its port, so it starts again on the same one."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, ephemeral_low - 10000), ephemeral_low), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port")


def _sleep_when_ready(ready) -> None:
    ready.set()
    # In short sleeps, as a real process's main thread wakes often: Python runs a signal's handler in the main
    # thread, and a signal the kernel gave to another thread (had a library started one) would wait out one long
    # sleep. A child outlived SIGTERM by 10 s once (CI49), cause not found; tests/peer_agent/test_stop_request.py
    # prints the child's threads and signal masks should it happen again.
    for _ in range(600):
        time.sleep(0.1)


def forked_child() -> multiprocessing.Process:
    """A forked child that sleeps, once it runs Python code of its own: a signal that arrives while the
    interpreter is still settling after the fork is cleared by it, and would make the test flaky."""
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=_sleep_when_ready, args=(ready,), daemon=True)
    child.start()
    assert ready.wait(30)
    return child


def processes_kill(processes: list[psutil.Process]) -> None:
    """Give these processes 2 s to exit, then kill the ones left."""
    _gone, alive = psutil.wait_procs(processes, timeout=2)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


@contextlib.contextmanager
def running_dht(**kwargs):
    """A DHT peer on loopback, shut down afterwards with its p2pd and any other child it left."""
    from hivemind.dht import DHT

    kwargs.setdefault("host_maddrs", ["/ip4/127.0.0.1/tcp/0"])
    dht = DHT(start=True, startup_timeout=60, **kwargs)
    process = psutil.Process(dht.pid)
    descendants = [process, *process.children(recursive=True)]
    try:
        yield dht
    finally:
        dht.shutdown()
        processes_kill(descendants)


def loopback_dhts(count: int) -> list:
    """``count`` DHT peers on loopback that check no tokens, bootstrapped from the first. Given 60 s to
    start, as :func:`running_dht`: p2pd can take longer than hivemind's default 15 s on a loaded machine.
    The caller shuts them down."""
    from hivemind.dht import DHT

    first = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], startup_timeout=60)
    return [first] + [DHT(start=True, initial_peers=first.get_visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                          startup_timeout=60) for _ in range(count - 1)]


class RedisServer:
    """A redis-server of the test's own on a free loopback port, in ``folder``; killed and started
    again on the same port as a test needs (Debian's redis-server, as `.ci/run` installs)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port, self.process = folder, restartable_port(), None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", str(self.folder)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self._answers():
            assert self.process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def _answers(self) -> bool:
        try:
            return redis.Redis(port=self.port, socket_timeout=2).ping()
        except redis.ConnectionError:
            return False
