"""Test hosts on one machine: each in a network namespace of its own, joined by a bridge, each with
its own upload and download rate (a tc token bucket on each end of its link). For benchmarks of what
crosses a network, such as hivemind averaging between hosts of different bandwidths. Needs root and
iproute2 (``ip``, ``tc``); rates only (no delay or loss emulation).

Host i is the namespace ``<prefix><i>`` at 10.77.0.(i + 1)/24; the bridge is in the namespace
``<prefix>br``. Host i's link is a veth pair: ``<prefix><i>h`` in the host (its token bucket limits
what the host sends) and ``<prefix><i>b`` on the bridge (limits what it receives).

    with NetLab(3, rates=["100mbit", "100mbit", "20mbit"], prefix="avg") as lab:
        subprocess.run(lab.command(0, "ping", "-c", "1", lab.address(2)), check=True)

Leaving the block removes every namespace of the prefix (and with them their links and buckets),
also when it is left by an exception; ``up`` first removes any that an earlier run left behind.
From a shell, as root::

    python -m harness.netlab up 4 100mbit 100mbit 100mbit 20mbit
    python -m harness.netlab exec 0 python3 -m http.server
    python -m harness.netlab down
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence

SUBNET = "10.77.0"
BURST = "64kb"
LATENCY = "400ms"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("ip", *arguments, check=check)


def _tc(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("tc", *arguments, check=check)


def rate_text(rate: str | float | None) -> str | None:
    """A tc rate from ``"20mbit"`` (as it is), a number of Mbit/s, or ``None``/``"none"`` (unshaped)."""
    if rate is None or rate == "none":
        return None
    if isinstance(rate, int | float):
        return f"{rate:g}mbit"
    return rate


class NetLab:
    """``hosts`` test hosts, host i shaped at ``rates[i]`` (a tc rate such as ``"100mbit"``, Mbit/s as a
    number, or None: unshaped; hosts past the end of ``rates`` are unshaped). ``up()`` makes them,
    ``down()`` removes them; as a context manager it does both."""

    def __init__(self, hosts: int, rates: Sequence[str | float | None] = (), *, prefix: str = "lab") -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", prefix):
            raise ValueError(f"prefix {prefix!r}: 1-6 lowercase letters and digits (interface names are short)")
        if not 1 <= hosts <= 200:
            raise ValueError(f"{hosts} hosts: 1 to 200")
        self.hosts, self.prefix = hosts, prefix
        self.rates = [rate_text(rates[i]) if i < len(rates) else None for i in range(hosts)]
        self.bridge = f"{prefix}br"

    def namespace(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def command(self, index: int, *argv: str) -> list[str]:
        """``argv`` to run inside host ``index`` (``ip netns exec``, which execs it: same process)."""
        return ["ip", "netns", "exec", self.namespace(index), *argv]

    def up(self) -> NetLab:
        self.down()
        try:
            _ip("netns", "add", self.bridge)
            _ip("-n", self.bridge, "link", "add", "name", "br0", "type", "bridge")
            _ip("-n", self.bridge, "link", "set", "br0", "up")
            _ip("-n", self.bridge, "link", "set", "lo", "up")
            for index in range(self.hosts):
                namespace, host_end, bridge_end = self.namespace(index), f"{self.prefix}{index}h", f"{self.prefix}{index}b"
                _ip("netns", "add", namespace)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", bridge_end)
                _ip("link", "set", host_end, "netns", namespace)
                _ip("link", "set", bridge_end, "netns", self.bridge)
                _ip("-n", self.bridge, "link", "set", bridge_end, "master", "br0")
                _ip("-n", self.bridge, "link", "set", bridge_end, "up")
                _ip("-n", namespace, "addr", "add", f"{self.address(index)}/24", "dev", host_end)
                _ip("-n", namespace, "link", "set", host_end, "up")
                _ip("-n", namespace, "link", "set", "lo", "up")
                self.shape(index, self.rates[index])
        except BaseException:
            self.down()
            raise
        return self

    def shape(self, index: int, rate: str | float | None) -> None:
        """Set host ``index``'s rate both ways (None: unshaped)."""
        rate = rate_text(rate)
        self.rates[index] = rate
        ends = [(self.namespace(index), f"{self.prefix}{index}h"), (self.bridge, f"{self.prefix}{index}b")]
        for namespace, device in ends:
            if rate is None:
                _tc("-n", namespace, "qdisc", "del", "dev", device, "root", check=False)  # none there: nothing to do
            else:
                _tc("-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate, "burst", BURST,
                    "latency", LATENCY)

    def namespaces(self) -> list[str]:
        """The namespaces of this prefix that exist now (this lab's, or an earlier one's)."""
        listed = _ip("netns", "list").stdout.split()
        pattern = re.compile(rf"{re.escape(self.prefix)}(\d+|br)")
        return [name for name in listed if pattern.fullmatch(name)]

    def down(self) -> None:
        """Remove every namespace of this prefix; their links and token buckets go with them."""
        for namespace in self.namespaces():
            _ip("netns", "del", namespace, check=False)
        left = self.namespaces()
        if left:
            raise RuntimeError(f"network namespaces not removed: {left}")

    def __enter__(self) -> NetLab:
        return self.up()

    def __exit__(self, *exc_info) -> None:
        self.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.netlab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default=os.environ.get("NETLAB_PREFIX", "lab"), help="namespace name prefix")
    commands = parser.add_subparsers(dest="action", required=True)
    up = commands.add_parser("up", help="make N hosts, host i at the i-th RATE (100mbit, 20mbit, none)")
    up.add_argument("hosts", type=int)
    up.add_argument("rates", nargs="*")
    shape = commands.add_parser("shape", help="change host I's rate (none: unshaped)")
    shape.add_argument("index", type=int)
    shape.add_argument("rate")
    run = commands.add_parser("exec", help="run a command inside host I")
    run.add_argument("index", type=int)
    run.add_argument("argv", nargs=argparse.REMAINDER)
    address = commands.add_parser("ip", help="print host I's address")
    address.add_argument("index", type=int)
    commands.add_parser("down", help="remove every namespace of the prefix")
    args = parser.parse_args(argv)

    if args.action == "up":
        lab = NetLab(args.hosts, args.rates, prefix=args.prefix).up()
        for index in range(lab.hosts):
            print(f"host {index}: {lab.address(index)} rate {lab.rates[index] or 'none'}")
        return 0
    lab = NetLab(getattr(args, "index", 0) + 1, prefix=args.prefix)  # enough hosts to name host I
    if args.action == "shape":
        lab.shape(args.index, args.rate)
    elif args.action == "exec":
        os.execvp("ip", lab.command(args.index, *args.argv))
    elif args.action == "ip":
        print(lab.address(args.index))
    else:
        lab.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
