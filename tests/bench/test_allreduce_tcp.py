"""The TCP baselines of bench.averaging_c1 average correctly, whatever the ring's order, the hosts behind
NAT and the slices' sizes (loopback: each host a thread with a listener of its own)."""

import socket
import threading

import numpy as np
import pytest

from bench import allreduce_tcp
from bench.allreduce_tcp import connect, ring_average, server_average

pytestmark = pytest.mark.timeout(120)


def average_on_loopback(vectors, *, strategy, order=(), server=0, firewalled=()):
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in vectors]
    addresses = [listener.getsockname() for listener in listeners]
    results, errors = [None] * len(vectors), []

    def host(index):
        try:
            links = connect(index, addresses, listeners[index], strategy=strategy, order=order, server=server,
                            firewalled=firewalled, timeout=30)
            try:
                for _ in range(2):  # the links serve round after round
                    results[index] = (ring_average(vectors[index], index, order or range(len(vectors)), links)
                                      if strategy == "ring" else
                                      server_average(vectors[index], index, server, len(vectors), links))
            finally:
                links.close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=host, args=(index,)) for index in range(len(vectors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for listener in listeners:
        listener.close()
    assert not errors, errors
    return results


@pytest.mark.parametrize("n, size, order, firewalled", [
    (2, 1000, (), ()),
    (3, 100_003, (), ()),
    (5, 300_001, (0, 3, 1, 4, 2), (3, 4)),  # hosts behind NAT, kept apart by the ring's order
    (4, 3, (), ()),  # fewer elements than hosts: some chunks are empty
])
def test_ring_all_reduce_gives_every_host_the_mean(monkeypatch, n, size, order, firewalled):
    monkeypatch.setattr(allreduce_tcp, "SLICE_BYTES", 4096)  # many slices, so the pipeline is exercised
    rng = np.random.default_rng(n)
    vectors = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    mean = np.mean(vectors, axis=0)
    for result in average_on_loopback(vectors, strategy="ring", order=order, firewalled=firewalled):
        assert np.abs(result - mean).max() < 5e-3  # fp16 on the wire, partial sums rounded at each hop


@pytest.mark.parametrize("n, server, firewalled", [(2, 0, ()), (4, 2, (0, 3))])
def test_a_parameter_server_gives_every_host_the_mean(monkeypatch, n, server, firewalled):
    monkeypatch.setattr(allreduce_tcp, "SLICE_BYTES", 4096)
    rng = np.random.default_rng(n)
    vectors = [rng.standard_normal(50_001).astype(np.float32) for _ in range(n)]
    mean = np.mean(vectors, axis=0)
    for result in average_on_loopback(vectors, strategy="server", server=server, firewalled=firewalled):
        assert np.abs(result - mean).max() < 5e-3


def test_hosts_behind_nat_side_by_side_in_a_ring_are_refused():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(ValueError, match="side by side"):
            connect(0, [listener.getsockname()] * 3, listener, strategy="ring", firewalled=(0, 1))
        with pytest.raises(ValueError, match="behind NAT"):
            connect(1, [listener.getsockname()] * 3, listener, strategy="server", server=0, firewalled=(0,))
    finally:
        listener.close()
