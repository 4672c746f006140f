"""Ring all-reduce and a parameter server over plain TCP: the baselines DeDLOC's adaptive averaging is
compared with (``bench.averaging_c1``, docs/benchmarks.md section 6).

Both average a float32 vector in fp16 on the wire, as the agent's gradient averager compresses, and
both are pipelined in slices so that they are the strong baselines, not strawmen:

- ``ring_average``: the ring of NCCL and Horovod. Reduce-scatter then all-gather, 2(n - 1) steps of a
  1/n chunk each; each chunk crosses in slices of ``SLICE_BYTES``, and a host sends a slice of its
  next step as soon as it has received (and added) that slice of the step before, so that every link
  of the ring carries data all the time. A host sends and receives 2(n - 1)/n of the vector.
- ``server_average``: one host (the server) takes every other host's vector and returns the mean,
  slice by slice as soon as every host's slice has arrived (pushes and pulls overlap). A server that is
  also a worker adds its own vector without sending it.

Connections are made once (``connect``) and kept for every round, as NCCL keeps its rings. A host
that cannot accept connections (``firewalled``: behind a NAT) dials both of its peers; two such
hosts cannot be neighbours in a ring, nor can one be the server.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Sequence

import numpy as np

SLICE_BYTES = 256 * 1024
WIRE = np.float16  # the agent's default gradient compression (peer_agent.training.compression_build)
_HELLO = struct.Struct("!ii")  # the dialer's index, and which link it is (see _LINK_*)
_LINK_RING, _LINK_SERVER = 0, 1


def _read_exactly(connection: socket.socket, view: memoryview) -> None:
    while view:
        received = connection.recv_into(view)
        if not received:
            raise ConnectionError("the peer closed its connection mid-round")
        view = view[received:]


def _dial(address: tuple[str, int], hello: bytes, deadline: float) -> socket.socket:
    while True:
        try:
            connection = socket.create_connection(address, timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        connection.settimeout(None)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.sendall(hello)
        return connection


def _accept(listener: socket.socket, count: int, deadline: float) -> dict[tuple[int, int], socket.socket]:
    accepted = {}
    listener.settimeout(max(1.0, deadline - time.monotonic()))
    while len(accepted) < count:
        connection, _ = listener.accept()
        connection.settimeout(None)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = bytearray(_HELLO.size)
        _read_exactly(connection, memoryview(hello))
        index, link = _HELLO.unpack(hello)
        accepted[(index, link)] = connection
    return accepted


class Links:
    """This host's connections: for a ring, to the next host and from the previous one (in ``order``);
    for a server, to every worker (or, for a worker, to the server)."""

    def __init__(self) -> None:
        self.to_next: socket.socket | None = None
        self.from_previous: socket.socket | None = None
        self.to_workers: dict[int, socket.socket] = {}
        self.to_server: socket.socket | None = None

    def close(self) -> None:
        for connection in [self.to_next, self.from_previous, self.to_server, *self.to_workers.values()]:
            if connection is not None:
                connection.close()


def connect(index: int, addresses: Sequence[tuple[str, int]], listener: socket.socket, *, strategy: str,
            order: Sequence[int] = (), server: int = 0, firewalled: Sequence[int] = (),
            timeout: float = 120.0) -> Links:
    """This host's links for ``strategy`` ("ring": in ``order``, by default the hosts' own; "server": to
    host ``server``). ``listener`` is this host's, already listening at ``addresses[index]``."""
    firewalled, deadline, links = set(firewalled), time.monotonic() + timeout, Links()
    if strategy == "ring":
        order = list(order) or list(range(len(addresses)))
        position = order.index(index)
        following, preceding = order[(position + 1) % len(order)], order[position - 1]
        if {index, following} <= firewalled or {index, preceding} <= firewalled:
            raise ValueError(f"hosts behind NAT side by side in the ring {order}: neither can reach the other")
        hello = _HELLO.pack(index, _LINK_RING)
        # A link is dialed by its sender unless its receiver is behind NAT, which then dials the sender.
        if following not in firewalled:
            links.to_next = _dial(addresses[following], hello, deadline)
        if index in firewalled:
            links.from_previous = _dial(addresses[preceding], hello, deadline)
        expected = (following in firewalled) + (index not in firewalled)
        accepted = _accept(listener, expected, deadline) if expected else {}
        links.to_next = links.to_next or accepted[(following, _LINK_RING)]
        links.from_previous = links.from_previous or accepted[(preceding, _LINK_RING)]
    elif strategy == "server":
        if server in firewalled:
            raise ValueError(f"the server, host {server}, is behind NAT: no worker can reach it")
        if index == server:
            accepted = _accept(listener, len(addresses) - 1, deadline)
            links.to_workers = {worker: connection for (worker, _), connection in accepted.items()}
        else:
            links.to_server = _dial(addresses[server], _HELLO.pack(index, _LINK_SERVER), deadline)
    else:
        raise ValueError(f"strategy {strategy!r}: ring or server")
    return links


def _slices(start: int, stop: int, per_slice: int) -> list[slice]:
    return [slice(begin, min(begin + per_slice, stop)) for begin in range(start, stop, per_slice)] or [slice(start, start)]


def _fail(progress: threading.Condition, failure: list[BaseException], error: BaseException) -> None:
    """Record a thread's error and wake every thread waiting on ``progress``, so that all of them end."""
    with progress:
        failure.append(error)
        progress.notify_all()


def ring_average(vector: np.ndarray, index: int, order: Sequence[int], links: Links) -> np.ndarray:
    """The mean of every host's ``vector`` (float32, one dimension), by ring all-reduce."""
    n, position = len(order), list(order).index(index)
    result = vector.astype(np.float32, copy=True)
    bounds = np.linspace(0, result.size, n + 1).astype(np.int64)
    per_slice = SLICE_BYTES // np.dtype(WIRE).itemsize
    chunks = [_slices(int(bounds[c]), int(bounds[c + 1]), per_slice) for c in range(n)]
    # Step s (0 <= s < 2(n - 1)): send chunk sent[s], receive chunk received[s]. The first n - 1 steps
    # reduce (add what arrives), the rest gather (keep it). The chunk sent at step s is the one received at
    # step s - 1, slice by slice: the pipeline.
    steps = 2 * (n - 1)
    sent = [(position - s) % n for s in range(n - 1)] + [(position + 1 - s) % n for s in range(n - 1)]
    received = [(position - s - 1) % n for s in range(n - 1)] + [(position - s) % n for s in range(n - 1)]
    done = [0] * steps  # slices of each step received so far
    progress = threading.Condition()
    failure: list[BaseException] = []

    def send() -> None:
        try:
            for step in range(steps):
                for k, part in enumerate(chunks[sent[step]]):
                    if step:
                        with progress:
                            progress.wait_for(lambda step=step, k=k: done[step - 1] > k or failure)
                        if failure:
                            return
                    links.to_next.sendall(result[part].astype(WIRE).tobytes())
        except BaseException as error:
            _fail(progress, failure, error)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    buffer = np.empty(per_slice, dtype=WIRE)
    try:
        for step in range(steps):
            for part in chunks[received[step]]:
                wire = buffer[:part.stop - part.start]
                _read_exactly(links.from_previous, memoryview(wire).cast("B"))
                if step < n - 1:
                    result[part] += wire
                    if step == n - 2:
                        result[part] /= n
                else:
                    result[part] = wire
                with progress:
                    done[step] += 1
                    progress.notify_all()
    except BaseException as error:
        _fail(progress, failure, error)
    sender.join()
    if failure:
        raise failure[0]
    return result


def server_average(vector: np.ndarray, index: int, server: int, n: int, links: Links) -> np.ndarray:
    """The mean of every host's ``vector`` (float32, one dimension), through host ``server``."""
    per_slice = SLICE_BYTES // np.dtype(WIRE).itemsize
    parts = _slices(0, vector.size, per_slice)
    result = np.empty(vector.size, dtype=np.float32)
    if index != server:
        def push() -> None:
            for part in parts:
                links.to_server.sendall(vector[part].astype(WIRE).tobytes())

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        buffer = np.empty(per_slice, dtype=WIRE)
        for part in parts:
            wire = buffer[:part.stop - part.start]
            _read_exactly(links.to_server, memoryview(wire).cast("B"))
            result[part] = wire
        pusher.join()
        return result

    result[:] = vector  # the server's own vector, added without crossing the wire
    arrived = [1] * len(parts)
    progress = threading.Condition()
    failure: list[BaseException] = []

    def take(connection: socket.socket) -> None:
        buffer = np.empty(per_slice, dtype=WIRE)
        try:
            for k, part in enumerate(parts):
                wire = buffer[:part.stop - part.start]
                _read_exactly(connection, memoryview(wire).cast("B"))
                with progress:
                    result[part] += wire
                    arrived[k] += 1
                    if arrived[k] == n:
                        result[part] /= n
                    progress.notify_all()
        except BaseException as error:
            _fail(progress, failure, error)

    def give(connection: socket.socket) -> None:
        try:
            for k, part in enumerate(parts):
                with progress:
                    progress.wait_for(lambda k=k: arrived[k] == n or failure)
                if failure:
                    return
                connection.sendall(result[part].astype(WIRE).tobytes())
        except BaseException as error:
            _fail(progress, failure, error)

    threads = [threading.Thread(target=work, args=(connection,), daemon=True)
               for connection in links.to_workers.values() for work in (take, give)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failure:
        raise failure[0]
    return result
