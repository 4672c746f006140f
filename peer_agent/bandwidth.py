"""How fast this machine talks to the portal, and whether other peers can reach it.

What is measured, exactly:

- **download**: the wall time of one HTTP GET of a file from the portal (the run's
  ``tokenizer.json``, or a data file), from sending the request to the last byte, over the
  bytes received. It includes the request's round trip and TCP slow start, so for files of a
  few hundred kB it underestimates the line rate; and it is the path to the portal, not to other
  peers. Treat it as a lower bound on download bandwidth.
- **upload**: not measured. The portal has no endpoint to upload to, and timing a join or report
  would say nothing. The bandwidth declared to the swarm (hivemind uses it to split all-reduce
  work in proportion) is the ``--bandwidth`` override if given, else the run's
  ``min_bandwidth_mbps`` floor, lowered to the measured download when that is lower, since home
  connections rarely upload faster than they download (only when at least 1 MB was timed).
- **reachability**: whether the listen (or announced) address is a public IP. No connection is
  tried from outside, so a firewall or an unforwarded port still goes unnoticed: pass
  ``--client-mode on`` if peers cannot connect to you.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from peer_agent.portal import Download, PortalClient

RELIABLE_BYTES = 1 << 20


@dataclass(frozen=True)
class BandwidthMeasurement:
    """A timed download from the portal (``upload_mbps`` is always None: nothing measures it)."""

    download_mbps: float | None
    bytes: int
    seconds: float
    source: str
    upload_mbps: float | None = None

    @property
    def reliable(self) -> bool:
        """Large enough that slow start and the round trip do not dominate the time."""
        return self.bytes >= RELIABLE_BYTES

    def describe(self) -> str:
        if self.download_mbps is None:
            return f"download not measured ({self.source})"
        caveat = "" if self.reliable else ", a lower bound: the file is small"
        return (f"download {self.download_mbps:.1f} Mbit/s ({self.bytes / 1e6:.2f} MB of {self.source} in "
                f"{self.seconds:.2f} s{caveat}); upload not measured")


def measurement_from_download(download: Download, source: str) -> BandwidthMeasurement:
    """The download rate of a transfer that already happened."""
    rate = download.size * 8 / download.seconds / 1e6 if download.seconds > 0 and download.size else None
    return BandwidthMeasurement(rate, download.size, download.seconds, source)


def measure(portal: PortalClient, url: str, dest: Path, *, source: str = "tokenizer.json",
            authorize: bool = True) -> BandwidthMeasurement:
    """Download ``url`` (a file the portal serves) into ``dest`` and time it."""
    return measurement_from_download(portal.download(url, dest, authorize=authorize), source)


def declared_bandwidth(override_mbps: float | None, measurement: BandwidthMeasurement | None,
                       floor_mbps: float) -> tuple[float, str]:
    """The bandwidth to declare to the swarm, and where it comes from."""
    if override_mbps is not None:
        return override_mbps, "from --bandwidth"
    measured = measurement.download_mbps if measurement and measurement.reliable else None
    if measured is not None and measured < floor_mbps:
        return measured, (f"the measured download, below the run's expected {floor_mbps:g} Mbit/s: "
                                           "averaging may wait for this peer")
    return floor_mbps, "the run's expected bandwidth, since upload is not measured (set --bandwidth to declare yours)"


@dataclass(frozen=True)
class Reachability:
    """Whether other peers could dial this machine, as far as its own addresses tell."""

    address: str | None
    public: bool
    reason: str


def _maddr_ip(maddr: str) -> tuple[str, str] | None:
    match = re.match(r"^/(ip4|ip6)/([^/]+)", maddr)
    return (match[1], match[2]) if match else None


def _outbound_ip(family: str) -> str | None:
    """The local address the OS would use to reach the internet (a UDP connect sends no packet)."""
    af, probe = (socket.AF_INET, "192.0.2.1") if family == "ip4" else (socket.AF_INET6, "2001:db8::1")
    try:
        with socket.socket(af, socket.SOCK_DGRAM) as sock:
            sock.connect((probe, 9))
            return sock.getsockname()[0]
    except OSError:
        return None


def reachable(host_maddrs: list[str], announce_maddrs: list[str] | None = None) -> Reachability:
    """Best effort: is the announced, listen or outbound address a public (global) IP?"""
    for maddr in [*(announce_maddrs or []), *host_maddrs]:
        parsed = _maddr_ip(maddr)
        if parsed is None:
            continue
        family, ip = parsed
        where = "announced" if maddr in (announce_maddrs or []) else "listen"
        if ip in ("0.0.0.0", "::"):
            ip = _outbound_ip(family)
            where = "outbound"
            if ip is None:
                continue
        if ipaddress.ip_address(ip).is_global:
            return Reachability(ip, True, f"the {where} address {ip} is public")
        return Reachability(ip, False, f"the {where} address {ip} is not public (behind NAT?): other peers cannot dial it")
    return Reachability(None, False, "no usable address found")


def client_mode_choose(setting: str, run_policy: str, reach: Reachability) -> tuple[bool, str]:
    """Decide client mode: the organizer's "always" wins, then the volunteer's on/off, then reachability."""
    if run_policy == "always":
        return True, "the run asks every volunteer to join in client mode"
    if setting in ("on", "off"):
        return setting == "on", f"--client-mode {setting}"
    if run_policy == "never" and reach.public:
        return False, reach.reason
    return (not reach.public), reach.reason
