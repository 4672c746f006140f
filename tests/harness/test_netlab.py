"""harness/netlab.py: test hosts in network namespaces reach each other over the bridge at their
shaped rates, and leaving the lab removes every namespace of its prefix, also after an error. Needs
root and iproute2 (what bench/averaging.py needs); skipped where namespaces cannot be made."""

import os
import shutil
import subprocess
import sys

import pytest

from harness.netlab import NetLab, rate_text

RECEIVER = """
import socket, sys, time
server = socket.create_server(("0.0.0.0", 5001))
print("listening", flush=True)
connection, _ = server.accept()
started, received = time.monotonic(), 0
while chunk := connection.recv(1 << 16):
    received += len(chunk)
print(received, time.monotonic() - started, flush=True)
"""
SENDER = "import socket, sys; socket.create_connection((sys.argv[1], 5001)).sendall(bytes(int(sys.argv[2])))"


def namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


@pytest.fixture
def prefix():
    """A prefix no other lab on this machine uses; skips the test where namespaces cannot be made."""
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs root and iproute2 (ip, tc)")
    prefix = f"nt{os.getpid() % 10000}"
    if subprocess.run(["ip", "netns", "add", f"{prefix}probe"], capture_output=True).returncode:
        pytest.skip("network namespaces cannot be made here")
    subprocess.run(["ip", "netns", "del", f"{prefix}probe"], check=True)
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
            received, seconds = receiver.communicate(timeout=60)[0].split()
        finally:
            receiver.kill()
        # 1 MB at 8 Mbit/s takes 1 s; the token bucket's 64 kB burst and timing leave a margin.
        assert int(received) == 1_000_000 and float(seconds) >= 0.8
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
