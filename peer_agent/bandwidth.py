"""How fast this machine talks to the portal, and whether other peers can reach it.

What is measured, exactly:

- **download**: the wall time of one HTTP GET of 4 MiB of random bytes from the portal's probe
  (``/api/v1/probe/download``), from sending the request to the last byte, over the bytes that came
  over the wire. Random bytes cannot be compressed on the way, so a proxy cannot inflate the rate.
- **upload**: the wall time of one HTTP POST of 2 MiB of random bytes to the portal's probe
  (``/api/v1/probe/upload``), from sending the request to the portal's answer that it received them.

Both include one request round trip and TCP slow start, and both time the path to the portal, not
to other peers: treat them as lower bounds. A portal without the probes (older than the agent)
answers 404; then the download is timed on the run's ``tokenizer.json`` instead (a lower bound
when the file is under 1 MiB) and upload is not measured.

The bandwidth declared to the swarm, which hivemind uses to split all-reduce work in proportion to
how fast each peer can send its share, is the measured upload, capped by ``--bandwidth`` if given;
without a measured upload it is ``--bandwidth``, else the run's ``min_bandwidth_mbps`` floor lowered
to a slower measured download (home connections rarely upload faster than they download).

Whether other peers can reach this machine is learned by a dial-back from the run's backbone
(:mod:`peer_agent.reachability`), not from its address.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peer_agent.i18n import _
from peer_agent.portal import PortalClient, PortalRefused, Transfer
from peer_agent.reachability import RELAY_DATA_LIMIT_BYTES, RELAYED_VECTOR_MAX_BYTES, Reachability

PROBE_DOWNLOAD_BYTES = 4 << 20
PROBE_UPLOAD_BYTES = 2 << 20
RELIABLE_BYTES = 1 << 20


def _mbps(transfer: Transfer | None) -> float | None:
    if transfer is None or transfer.seconds <= 0 or not transfer.size:
        return None
    return transfer.size * 8 / transfer.seconds / 1e6


def _reliable(transfer: Transfer | None) -> bool:
    """Large enough that slow start and the round trip do not dominate the time."""
    return transfer is not None and transfer.size >= RELIABLE_BYTES


@dataclass(frozen=True)
class BandwidthMeasurement:
    """Timed transfers to and from the portal; ``upload`` is None when it could not be measured, and
    ``upload_note`` then says why."""

    download: Transfer | None
    upload: Transfer | None
    source: str
    upload_note: str = ""

    @property
    def download_mbps(self) -> float | None:
        return _mbps(self.download)

    @property
    def upload_mbps(self) -> float | None:
        return _mbps(self.upload)

    def describe(self) -> str:
        upload = _describe("upload", self.upload) if self.upload else f"upload not measured ({self.upload_note})"
        return f"{_describe('download', self.download, self.source)}; {upload}"


def _describe(direction: str, transfer: Transfer | None, source: str = "") -> str:
    rate = _mbps(transfer)
    if rate is None:
        return f"{direction} not measured"
    of = f" of {source}" if source else ""
    caveat = "" if _reliable(transfer) else ", a lower bound: the transfer is small"
    return f"{direction} {rate:.1f} Mbit/s ({transfer.size / 1e6:.2f} MB{of} in {transfer.seconds:.2f} s{caveat})"


def measure_probe(portal: PortalClient, fallback: Callable[[], Transfer]) -> BandwidthMeasurement:
    """Time a download and an upload with the portal's probes. A portal without them (404) gets the
    ``fallback`` download (the run's ``tokenizer.json``) timed instead, and no upload."""
    try:
        download = portal.probe_download(PROBE_DOWNLOAD_BYTES)
    except PortalRefused as refused:
        if refused.status != 404:
            raise
        return BandwidthMeasurement(fallback(), None, "tokenizer.json",
                                    "this portal has no upload probe; set --bandwidth to declare yours")
    try:
        upload = portal.probe_upload(PROBE_UPLOAD_BYTES)
    except PortalRefused as refused:  # e.g. a proxy in front of the portal with a smaller body limit
        return BandwidthMeasurement(download, None, "the portal's probe", f"the portal refused it: {refused.detail}")
    return BandwidthMeasurement(download, upload, "the portal's probe")


def declared_bandwidth(override_mbps: float | None, measurement: BandwidthMeasurement | None,
                       floor_mbps: float) -> tuple[float, str]:
    """The bandwidth to declare to the swarm, and where it comes from."""
    upload = measurement.upload_mbps if measurement and _reliable(measurement.upload) else None
    if upload is not None:
        if override_mbps is not None and override_mbps < upload:
            return override_mbps, f"from --bandwidth (the measured upload is {upload:.1f} Mbit/s)"
        if upload < floor_mbps:
            return upload, (f"the measured upload, below the run's expected {floor_mbps:g} Mbit/s: "
                            "averaging may wait for this peer")
        return upload, "the measured upload"
    if override_mbps is not None:
        return override_mbps, "from --bandwidth"
    download = measurement.download_mbps if measurement and _reliable(measurement.download) else None
    if download is not None and download < floor_mbps:
        return download, (f"the measured download, below the run's expected {floor_mbps:g} Mbit/s: "
                          "averaging may wait for this peer (upload not measured)")
    return floor_mbps, "the run's expected bandwidth, since upload is not measured (set --bandwidth to declare yours)"


def client_mode_choose(setting: str, run_policy: str, reach: Reachability | None,
                       vector_bytes: int | None = None) -> tuple[bool, str]:
    """Decide client mode: the organizer's "always" wins, then the volunteer's on/off, then whether a
    backbone peer could dial this machine, directly or through its relay (``reach``; None: not checked).
    Through a relay only if a round's gradients (``vector_bytes``) fit what a relayed connection carries."""
    if run_policy == "always":
        return True, _("the run asks every volunteer to join in client mode")
    if setting in ("on", "off"):
        return setting == "on", f"--client-mode {setting}"
    if reach is None:
        return True, _("reachability not checked")
    if reach.path == "relayed" and vector_bytes is not None and vector_bytes > RELAYED_VECTOR_MAX_BYTES:
        return True, _("{reach}; but a relayed connection carries at most {limit} KiB, and this run averages "
                       "{size:.1f} MB a round").format(reach=reach.describe(), limit=RELAY_DATA_LIMIT_BYTES >> 10,
                                                       size=vector_bytes / 1e6)
    return (not reach.reachable), reach.describe()
