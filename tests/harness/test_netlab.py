"""harness/netlab.py: test hosts in network namespaces reach each other over the bridge at their
shaped rates, and leaving the lab removes every namespace of its prefix, also after an error. Needs
root and iproute2 (what bench/averaging.py needs); run as another user, it is skipped."""

import os
import re
import subprocess
import sys

import pytest

from harness.netlab import NetLab, rate_text

RECEIVER = """
import socket
server = socket.create_server(("0.0.0.0", 5001))
print("listening", flush=True)
connection, _ = server.accept()
received = 0
while chunk := connection.recv(1 << 16):
    received += len(chunk)
print(received, flush=True)
"""
SENDER = "import socket, sys; socket.create_connection((sys.argv[1], 5001)).sendall(bytes(int(sys.argv[2])))"


def namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


@pytest.fixture
def prefix():
    """A prefix no other lab on this machine uses. Making network namespaces takes root: `make test`
    run as another user skips these tests; CI runs as root with iproute2 (.ci/run), where they run."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root; CI runs these tests as root")
    prefix = f"nt{os.getpid() % 10000}"
    yield prefix
    assert not [name for name in namespaces() if name.startswith(prefix)], "the lab left namespaces behind"


def test_hosts_reach_each_other_at_the_receivers_rate_and_are_removed_on_exit(prefix):
    with NetLab(2, rates=[None, 8], prefix=prefix) as lab:
        assert {f"{prefix}0", f"{prefix}1", f"{prefix}br"} <= set(namespaces())
        shaped = subprocess.run(["tc", "-n", f"{prefix}br", "qdisc", "show"], capture_output=True, text=True).stdout
        assert f"dev {prefix}1b root" in shaped and "rate 8Mbit" in shaped
        receiver = subprocess.Popen(lab.command(1, sys.executable, "-c", RECEIVER), stdout=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout.readline().strip() == "listening"
            subprocess.run(lab.command(0, sys.executable, "-c", SENDER, lab.address(1), "1000000"), check=True, timeout=60)
            received = int(receiver.communicate(timeout=60)[0])
        finally:
            receiver.kill()
        assert received == 1_000_000
        # The receiver's token bucket carried the megabyte and held packets back to keep the rate
        # (its 64 kB burst lets only the start through unheld).
        stats = subprocess.run(["tc", "-s", "-n", f"{prefix}br", "qdisc", "show", "dev", f"{prefix}1b"],
                               capture_output=True, text=True, check=True).stdout
        sent, overlimits = (int(re.search(pattern, stats).group(1)) for pattern in (r"Sent (\d+) bytes", r"overlimits (\d+)"))
        assert sent >= 1_000_000 and overlimits > 0, stats
    assert not [name for name in namespaces() if name.startswith(prefix)]


def test_an_error_inside_the_lab_and_an_earlier_runs_leftovers_are_cleaned_up(prefix):
    subprocess.run(["ip", "netns", "add", f"{prefix}7"], check=True)  # left by a run that was killed
    with pytest.raises(RuntimeError, match="inside"):
        with NetLab(1, prefix=prefix):
            assert f"{prefix}7" not in namespaces()
            raise RuntimeError("inside")
    assert not [name for name in namespaces() if name.startswith(prefix)]


def test_rates_and_prefixes():
    assert [rate_text(rate) for rate in ("20mbit", 100, 2.5, None, "none")] == ["20mbit", "100mbit", "2.5mbit", None, None]
    with pytest.raises(ValueError, match="prefix"):
        NetLab(2, prefix="much-too-long")


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 5001), timeout=3).close()
except OSError as error:
    print(type(error).__name__)
else:
    print("connected")
"""
ACCEPT_ONE = """
import socket
server = socket.create_server(("0.0.0.0", 5001))
print("listening", flush=True)
connection, (peer, _) = server.accept()
print(peer, flush=True)
"""


def _listening(lab: NetLab, index: int) -> subprocess.Popen:
    server = subprocess.Popen(lab.command(index, sys.executable, "-c", ACCEPT_ONE), stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    return server


def _connect(lab: NetLab, index: int, address: str) -> str:
    done = subprocess.run(lab.command(index, sys.executable, "-c", CONNECT, address), capture_output=True, text=True,
                          timeout=30, check=True)
    return done.stdout.strip()


def test_a_host_behind_nat_reaches_a_public_host_under_its_routers_address_and_nobody_reaches_it(prefix):
    with NetLab(3, rates=[None, None, 8], prefix=prefix, nat=[1, 2]) as lab:
        assert {f"{prefix}1n", f"{prefix}2n"} <= set(namespaces())
        assert lab.inner_address(1) != lab.address(1) and lab.inner_address(0) == lab.address(0)
        # The NATed host's token bucket is on its router's link to the bridge.
        shaped = subprocess.run(["tc", "-n", f"{prefix}2n", "qdisc", "show"], capture_output=True, text=True).stdout
        assert f"dev {prefix}2h root" in shaped and "rate 8Mbit" in shaped

        public = _listening(lab, 0)
        try:
            assert _connect(lab, 1, lab.address(0)) == "connected"
            seen_as = public.communicate(timeout=30)[0].strip()
        finally:
            public.kill()
        assert seen_as == lab.address(1), "the public host sees the router's address, not the host's own"

        behind = _listening(lab, 1)
        try:
            # Nothing is forwarded to the host: its router refuses (no port is open there), and its own
            # address is not routed from outside, even by a host that adds a route through the router.
            assert _connect(lab, 0, lab.address(1)) == "ConnectionRefusedError"
            subprocess.run(lab.command(0, "ip", "route", "add", f"{lab.inner_address(1)}/32", "via", lab.address(1)),
                           check=True)
            assert _connect(lab, 0, lab.inner_address(1)) in ("TimeoutError", "OSError")
            assert _connect(lab, 2, lab.address(1)) == "ConnectionRefusedError", "nor from behind another NAT"
            assert behind.poll() is None, "no connection reached the host behind NAT"
        finally:
            behind.kill()
    assert not [name for name in namespaces() if name.startswith(prefix)]
