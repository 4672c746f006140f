"""Test hosts on one machine: each in a network namespace of its own, joined by a bridge, each with
its own upload and download rate (a tc token bucket on each end of its link). For benchmarks of what
crosses a network, such as hivemind averaging between hosts of different bandwidths. Needs root and
iproute2 (``ip``, ``tc``); rates only (no delay or loss emulation); ``iptables`` for hosts behind NAT.

Host i is the namespace ``<prefix><i>`` at 10.77.0.(i + 1)/24 (``subnet`` chooses another /24); the bridge is in the namespace
``<prefix>br``. Host i's link is a veth pair: ``<prefix><i>h`` in the host (its token bucket limits
what the host sends) and ``<prefix><i>b`` on the bridge (limits what it receives).

    with NetLab(3, rates=["100mbit", "100mbit", "20mbit"], prefix="avg") as lab:
        subprocess.run(lab.command(0, "ping", "-c", "1", lab.address(2)), check=True)

A host in ``nat`` sits behind a router of its own, as a volunteer's machine behind a home router:
the router is the namespace ``<prefix><i>n``, which holds the host's link to the bridge and its address
10.77.0.(i + 1); the host is alone on 10.78.(i + 1).0/24 behind it (veth ``<prefix><i>p`` in the host,
``<prefix><i>q`` in the router). The router masquerades what the host sends (iptables MASQUERADE) and
forwards nothing that starts outside: the host reaches every other host, and nothing reaches it
unless it started the connection. ``address(i)`` is where others see it (the router's address),
``inner_address(i)`` the host's own.

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
# What libp2p counts as a public address (go-multiaddr's manet.IsPublicAddr): a lab about NAT puts its
# bridge there, since libp2p keeps private addresses out of what it announces through relays. The
# namespaces have no route out of the lab, so no packet reaches the block's real owner.
PUBLIC_SUBNET = "11.77.0"
NAT_SUBNET = "10.78"  # host i behind NAT: 10.78.(i + 1).2, its router 10.78.(i + 1).1
BURST = "64kb"
LATENCY = "400ms"  # the longest a packet waits in a bucket's queue: tc's tbf drops what would wait longer


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("ip", *arguments, check=check)


def _iptables(namespace: str, *arguments: str) -> subprocess.CompletedProcess:
    return _run("ip", "netns", "exec", namespace, "iptables", *arguments)


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
    ``down()`` removes them; as a context manager it does both. The hosts whose indices are in ``nat``
    are each behind a NAT of their own. ``latency`` bounds each bucket's queue (as tc's tbf reads it)."""

    def __init__(self, hosts: int, rates: Sequence[str | float | None] = (), *, prefix: str = "lab",
                 nat: Sequence[int] = (), subnet: str = SUBNET, latency: str = LATENCY) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", prefix):
            raise ValueError(f"prefix {prefix!r}: 1-6 lowercase letters and digits (interface names are short)")
        if not 1 <= hosts <= 200:
            raise ValueError(f"{hosts} hosts: 1 to 200")
        if any(not 0 <= index < hosts for index in nat):
            raise ValueError(f"hosts behind NAT {list(nat)}: indices from 0 to {hosts - 1}")
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet {subnet!r}: the first three numbers of a /24, such as {SUBNET}")
        self.hosts, self.prefix, self.nat, self.subnet = hosts, prefix, frozenset(nat), subnet
        self.rates = [rate_text(rates[i]) if i < len(rates) else None for i in range(hosts)]
        self.bridge = f"{prefix}br"
        self.latency = latency

    def namespace(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def router(self, index: int) -> str:
        """The namespace of host ``index``'s NAT router (only hosts in ``nat`` have one)."""
        return f"{self.prefix}{index}n"

    def _edge(self, index: int) -> str:
        """The namespace that holds host ``index``'s link to the bridge: the router's, behind NAT."""
        return self.router(index) if index in self.nat else self.namespace(index)

    def address(self, index: int) -> str:
        """Where the other hosts see host ``index``: behind NAT, its router's address."""
        return f"{self.subnet}.{index + 1}"

    def inner_address(self, index: int) -> str:
        """Host ``index``'s own address: behind NAT, a private one no other host can reach."""
        return f"{NAT_SUBNET}.{index + 1}.2" if index in self.nat else self.address(index)

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
                edge, host_end, bridge_end = self._edge(index), f"{self.prefix}{index}h", f"{self.prefix}{index}b"
                _ip("netns", "add", self.namespace(index))
                if index in self.nat:
                    _ip("netns", "add", edge)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", bridge_end)
                _ip("link", "set", host_end, "netns", edge)
                _ip("link", "set", bridge_end, "netns", self.bridge)
                _ip("-n", self.bridge, "link", "set", bridge_end, "master", "br0")
                _ip("-n", self.bridge, "link", "set", bridge_end, "up")
                _ip("-n", edge, "addr", "add", f"{self.address(index)}/24", "dev", host_end)
                _ip("-n", edge, "link", "set", host_end, "up")
                _ip("-n", edge, "link", "set", "lo", "up")
                if index in self.nat:
                    self._nat_up(index)
                self.shape(index, self.rates[index])
        except BaseException:
            self.down()
            raise
        return self

    def _nat_up(self, index: int) -> None:
        """Host ``index`` alone on a private link behind its router, which masquerades what leaves and
        forwards inward only the replies to connections the host started."""
        namespace, router = self.namespace(index), self.router(index)
        inner, outer, public = f"{self.prefix}{index}p", f"{self.prefix}{index}q", f"{self.prefix}{index}h"
        gateway = f"{NAT_SUBNET}.{index + 1}.1"
        _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        _ip("link", "set", inner, "netns", namespace)
        _ip("link", "set", outer, "netns", router)
        _ip("-n", router, "addr", "add", f"{gateway}/24", "dev", outer)
        _ip("-n", router, "link", "set", outer, "up")
        _ip("-n", namespace, "addr", "add", f"{self.inner_address(index)}/24", "dev", inner)
        _ip("-n", namespace, "link", "set", inner, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "route", "add", "default", "via", gateway)
        _run("ip", "netns", "exec", router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _iptables(router, "-t", "nat", "-A", "POSTROUTING", "-o", public, "-j", "MASQUERADE")
        _iptables(router, "-A", "FORWARD", "-i", outer, "-o", public, "-j", "ACCEPT")
        _iptables(router, "-A", "FORWARD", "-i", public, "-o", outer, "-m", "conntrack", "--ctstate",
                  "ESTABLISHED,RELATED", "-j", "ACCEPT")
        _iptables(router, "-P", "FORWARD", "DROP")

    def shape(self, index: int, rate: str | float | None) -> None:
        """Set host ``index``'s rate both ways (None: unshaped)."""
        rate = rate_text(rate)
        self.rates[index] = rate
        ends = [(self._edge(index), f"{self.prefix}{index}h"), (self.bridge, f"{self.prefix}{index}b")]
        for namespace, device in ends:
            if rate is None:
                _tc("-n", namespace, "qdisc", "del", "dev", device, "root", check=False)  # none there: nothing to do
            else:
                _tc("-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate, "burst", BURST,
                    "latency", self.latency)

    def namespaces(self) -> list[str]:
        """The namespaces of this prefix that exist now (this lab's, or an earlier one's)."""
        listed = _ip("netns", "list").stdout.split()
        pattern = re.compile(rf"{re.escape(self.prefix)}(\d+n?|br)")
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
    up.add_argument("--nat", default="", metavar="I,J", help="hosts behind a NAT of their own (comma-separated)")
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
        nat = [int(index) for index in args.nat.split(",") if index]
        lab = NetLab(args.hosts, args.rates, prefix=args.prefix, nat=nat).up()
        for index in range(lab.hosts):
            behind = f" behind NAT at {lab.inner_address(index)}" if index in lab.nat else ""
            print(f"host {index}: {lab.address(index)}{behind} rate {lab.rates[index] or 'none'}")
        return 0
    index = getattr(args, "index", 0)
    lab = NetLab(index + 1, prefix=args.prefix)  # enough hosts to name host I
    if lab.router(index) in lab.namespaces():  # host I is behind NAT: its link to the bridge is its router's
        lab = NetLab(index + 1, prefix=args.prefix, nat=[index])
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
