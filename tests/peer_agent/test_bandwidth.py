"""Bandwidth: upload and download timed against the portal's probes, and what the agent declares to the swarm."""

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from peer_agent.bandwidth import (
    PROBE_DOWNLOAD_BYTES,
    PROBE_UPLOAD_BYTES,
    BandwidthMeasurement,
    declared_bandwidth,
    measure_probe,
)
from peer_agent.portal import PortalClient, PortalRefused, Transfer
from tests.peer_agent.fakes import MIB, TOKEN, ProbeRoutes, send


class ProbePortal:
    """A portal on loopback with the probes (``probes=False``: an older portal that answers 404)."""

    def __init__(self, routes: ProbeRoutes | None = None, probes: bool = True):
        self.routes = routes or ProbeRoutes()
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if not (probes and portal.routes.answer(self)):
                    send(self, 404, {"error": {"code": "not_found", "detail": "no such page"}})

            do_POST = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    """``serve(**kwargs)``: a started ProbePortal, closed after the test."""
    started = []

    def start(**kwargs) -> ProbePortal:
        started.append(ProbePortal(**kwargs))
        return started[-1]

    yield start
    for portal in started:
        portal.close()


def tokenizer_fallback(calls: list) -> Callable[[], Transfer]:
    """A stand-in for downloading the run's tokenizer.json: 300 kB in 0.5 s, counted in ``calls``."""

    def fallback() -> Transfer:
        calls.append(1)
        return Transfer(300_000, 0.5)

    return fallback


def test_the_probe_times_4_mib_down_and_2_mib_up_and_reports_both_rates(serve):
    portal = serve()
    calls = []
    with PortalClient(portal.url, TOKEN, attempts=1) as client:
        measured = measure_probe(client, tokenizer_fallback(calls))
    assert (PROBE_DOWNLOAD_BYTES, PROBE_UPLOAD_BYTES) == (4 * MIB, 2 * MIB)
    assert (portal.routes.downloads, portal.routes.uploads) == ([4 * MIB], [2 * MIB])
    assert (measured.download.size, measured.upload.size) == (4 * MIB, 2 * MIB) and not calls
    assert measured.download_mbps == pytest.approx(4 * MIB * 8 / measured.download.seconds / 1e6)
    assert measured.upload_mbps == pytest.approx(2 * MIB * 8 / measured.upload.seconds / 1e6)
    assert measured.download_mbps > 0 and measured.upload_mbps > 0
    described = measured.describe()
    assert f"download {measured.download_mbps:.1f} Mbit/s (4.19 MB" in described
    assert f"upload {measured.upload_mbps:.1f} Mbit/s (2.10 MB" in described and "not measured" not in described


def test_the_rates_come_from_the_time_the_transfers_took(serve):
    portal = serve(routes=ProbeRoutes(delay_s=0.25))
    with PortalClient(portal.url, TOKEN, attempts=1) as client:
        measured = measure_probe(client, tokenizer_fallback([]))
    assert measured.download.seconds >= 0.25 and measured.upload.seconds >= 0.25
    assert measured.download_mbps <= 4 * MIB * 8 / 0.25 / 1e6
    assert measured.upload_mbps <= 2 * MIB * 8 / 0.25 / 1e6


def test_an_older_portal_without_probes_gets_the_tokenizer_download_timed_and_no_upload(serve):
    portal = serve(probes=False)
    calls = []
    with PortalClient(portal.url, TOKEN, attempts=1) as client:
        measured = measure_probe(client, tokenizer_fallback(calls))
    assert calls == [1] and measured.upload is None and measured.upload_mbps is None
    assert measured.download_mbps == pytest.approx(300_000 * 8 / 0.5 / 1e6)
    assert "of tokenizer.json" in measured.describe() and "a lower bound" in measured.describe()
    assert "upload not measured (this portal has no upload probe" in measured.describe()


def test_an_upload_refused_by_a_smaller_body_limit_keeps_the_measured_download(serve):
    portal = serve(routes=ProbeRoutes(upload_limit=MIB))
    with PortalClient(portal.url, TOKEN, attempts=1) as client:
        measured = measure_probe(client, tokenizer_fallback([]))
    assert measured.download.size == 4 * MIB and measured.upload is None
    assert "upload not measured (the portal refused it: upload at most 1 MiB)" in measured.describe()


def test_a_refused_token_is_not_mistaken_for_an_older_portal(serve):
    portal = serve()
    calls = []
    with PortalClient(portal.url, "agt_wrong", attempts=1) as client:
        with pytest.raises(PortalRefused) as refused:
            measure_probe(client, tokenizer_fallback(calls))
    assert refused.value.status == 401 and not calls


def measurement(download_mbps: float | None = None, upload_mbps: float | None = None, size: int = 2 * MIB):
    """Transfers of ``size`` bytes that took as long as the given rates say."""
    def transfer(rate):
        return Transfer(size, size * 8 / rate / 1e6) if rate else None

    return BandwidthMeasurement(transfer(download_mbps), transfer(upload_mbps), "test")


def test_the_measured_upload_is_declared_whether_above_or_below_the_runs_floor():
    assert declared_bandwidth(None, measurement(100.0, 40.0), 10.0) == (pytest.approx(40.0), "the measured upload")
    rate, source = declared_bandwidth(None, measurement(100.0, 4.0), 10.0)
    assert rate == pytest.approx(4.0) and "below the run's expected 10 Mbit/s" in source


def test_bandwidth_caps_the_measured_upload_but_does_not_raise_it():
    rate, source = declared_bandwidth(25.0, measurement(100.0, 40.0), 10.0)
    assert rate == 25.0 and source.startswith("from --bandwidth")
    assert declared_bandwidth(80.0, measurement(100.0, 40.0), 10.0)[0] == pytest.approx(40.0)


def test_without_a_measured_upload_the_override_then_the_floor_lowered_to_a_slow_download_is_declared():
    assert declared_bandwidth(25.0, measurement(4.0), 10.0) == (25.0, "from --bandwidth")
    assert declared_bandwidth(None, measurement(4.0), 10.0)[0] == pytest.approx(4.0)
    assert declared_bandwidth(None, measurement(400.0), 10.0)[0] == 10.0
    assert declared_bandwidth(None, None, 10.0)[0] == 10.0


def test_transfers_under_1_mib_are_too_small_to_declare():
    small = measurement(4.0, 2.0, size=100_000)
    assert declared_bandwidth(None, small, 10.0)[0] == 10.0
    assert "a lower bound: the transfer is small" in small.describe()
