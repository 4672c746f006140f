"""The agent's portal client: the wire contract's endpoints, retries, refusals and downloads."""

import datetime
import json
import multiprocessing
import time

import httpx
import pytest
from hivemind.utils.crypto import RSAPrivateKey

from peer_agent import __version__
from peer_agent import portal as portal_module
from peer_agent.bandwidth import client_mode_choose
from peer_agent.portal import AccessRefresher, CreditWatcher, PortalClient, PortalRefused, PortalUnavailable, backoff_delay
from peer_agent.protocol import DeviceInfo, JoinRequest, RunConfig
from peer_agent.reachability import Reachability

PORTAL = "http://portal.test"
TOKEN = "agt_secret"
PEER_KEY = RSAPrivateKey().get_public_key().to_bytes().decode()
ACCESS = {"username": "vik", "peer_public_key": PEER_KEY, "expiration_time": "2030-01-31 12:30:00.000000",
          "signature": "c2lnbmF0dXJl"}


def join_answer() -> dict:
    return {
        "session_id": 7, "run_id": "bengali-albert", "config": RunConfig().model_dump(mode="json"),
        "hivemind_access": ACCESS, "authority_public_key": PEER_KEY,
        "initial_peers": ["/ip4/203.0.113.1/tcp/31337/p2p/QmPeer"], "report_url": "ws://portal.test/ws/agent/",
        "tokenizer_url": f"{PORTAL}/api/v1/runs/bengali-albert/tokenizer.json",
        "data_files": [f"{PORTAL}/api/v1/data/signed/3.txt"],
    }


def error(status: int, code: str, detail: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "detail": detail}})


def client(handler, **kwargs) -> PortalClient:
    return PortalClient(PORTAL, TOKEN, transport=httpx.MockTransport(handler), backoff_s=0.001, **kwargs)


def join_request() -> JoinRequest:
    return JoinRequest(peer_public_key=PEER_KEY, agent_version=__version__,
                       device=DeviceInfo(kind="cpu", name="test CPU", precision="fp32"),
                       signed_at=datetime.datetime.now(datetime.UTC), key_proof="c2lnbmVk")


def test_join_sends_the_bearer_token_and_the_request_and_parses_the_answer():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(path=request.url.path, auth=request.headers["Authorization"], body=json.loads(request.content))
        return httpx.Response(200, json=join_answer())

    with client(handler) as portal:
        joined = portal.join("bengali-albert", join_request())
    assert seen["path"] == "/api/v1/runs/bengali-albert/join"
    assert seen["auth"] == f"Bearer {TOKEN}"
    assert seen["body"]["peer_public_key"] == PEER_KEY and seen["body"]["device"]["kind"] == "cpu"
    assert joined.session_id == 7 and joined.data_files == [f"{PORTAL}/api/v1/data/signed/3.txt"]


def test_a_4xx_answer_becomes_portal_refused_with_the_portals_sentence():
    sentence = "run “bengali-albert” is paused by its organizer; the agent will retry every 60 s"
    with client(lambda request: error(409, "run_paused", sentence)) as portal:
        with pytest.raises(PortalRefused) as refused:
            portal.join("bengali-albert", join_request())
    assert (refused.value.code, refused.value.detail, refused.value.status) == ("run_paused", sentence, 409)
    assert refused.value.paused


def test_a_coordinator_that_is_down_is_the_portals_answer_to_wait_for_not_a_failure_to_retry_at_once():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        answer = error(503, "coordinator_unavailable", "the coordinator of run “bengali-albert” is not reachable now")
        answer.headers["Retry-After"] = "10"
        return answer

    with client(handler) as portal:
        with pytest.raises(PortalRefused) as refused:
            portal.join("bengali-albert", join_request())
    assert (refused.value.code, refused.value.status, refused.value.retry_after) == ("coordinator_unavailable", 503, 10)
    assert len(calls) == 1


def test_a_4xx_answer_that_is_not_the_api_error_shape_still_reads_clearly():
    with client(lambda request: httpx.Response(404, text="<html>Not Found</html>")) as portal:
        with pytest.raises(PortalRefused) as refused:
            portal.me()
    assert refused.value.code == "http_404" and "404" in refused.value.detail


def test_5xx_and_connection_errors_are_retried_until_the_portal_answers():
    answers = iter([httpx.ConnectError("refused"), httpx.Response(502), httpx.Response(200, json={"username": "vik"})])

    def handler(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with client(handler) as portal:
        assert portal.me() == {"username": "vik"}


def test_retries_give_up_with_portal_unavailable():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503)

    with client(handler, attempts=3) as portal:
        with pytest.raises(PortalUnavailable):
            portal.me()
    assert len(calls) == 3


def test_4xx_answers_are_not_retried():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return error(401, "invalid_token", "this agent token is not valid")

    with client(handler) as portal:
        with pytest.raises(PortalRefused):
            portal.me()
    assert len(calls) == 1


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    for attempt in range(1, 10):
        delay = backoff_delay(attempt, 1.0, 30.0)
        ceiling = min(30.0, 2 ** (attempt - 1))
        assert ceiling / 2 <= delay <= ceiling


def test_refresh_returns_the_hivemind_access_object():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/sessions/7/refresh" and request.method == "POST"
        return httpx.Response(200, json={"hivemind_access": ACCESS})

    with client(handler) as portal:
        assert portal.refresh(7) == ACCESS


def test_the_credit_watcher_reads_the_machines_credit_for_the_display(monkeypatch):
    """``CreditWatcher.latest`` stays None while the portal cannot answer (an older portal: 404), and holds
    the machine's figures once it does; the endpoint itself is tests/accounts/test_volunteer_machines.py's."""
    figures = {"samples": 640, "confirmed_samples": 512, "pending_samples": 64, "lost_samples": 64,
               "credit": 5.12, "credit_pending": 0.64}
    answers = [error(404, "not_found", "no such route"), httpx.Response(200, json=figures)]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/sessions/7/credit" and request.headers["authorization"] == f"Bearer {TOKEN}"
        return answers.pop(0) if len(answers) > 1 else answers[0]

    real_client = PortalClient
    monkeypatch.setattr(portal_module, "PortalClient", lambda *args, **kwargs: real_client(
        *args, transport=httpx.MockTransport(handler), backoff_s=0.001, **kwargs))
    watcher = CreditWatcher(PORTAL, TOKEN, 7, interval=0.05, first_after=0.0)
    try:
        deadline = time.monotonic() + 10
        while watcher.latest is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.close()
    assert watcher.latest is not None and watcher.latest.model_dump() == figures
    assert len(answers) == 1, "the 404 was read first, and showed nothing"


def test_download_sends_the_token_only_when_asked_and_only_to_the_portal(tmp_path):
    auth_headers = {}

    def handler(request: httpx.Request) -> httpx.Response:
        auth_headers[request.url.path] = request.headers.get("Authorization")
        return httpx.Response(200, content=b"x" * 100_000)

    with client(handler) as portal:
        tokenizer = portal.download(f"{PORTAL}/api/v1/runs/r/tokenizer.json", tmp_path / "tokenizer.json", authorize=True)
        portal.download(f"{PORTAL}/api/v1/data/signed/3.txt", tmp_path / "3.txt")
        with pytest.raises(ValueError, match="not the portal"):
            portal.download("http://elsewhere.test/steal", tmp_path / "x", authorize=True)
    assert auth_headers == {"/api/v1/runs/r/tokenizer.json": f"Bearer {TOKEN}", "/api/v1/data/signed/3.txt": None}
    assert tokenizer.size == 100_000 and (tmp_path / "tokenizer.json").read_bytes() == b"x" * 100_000
    assert not list(tmp_path.glob("*.part"))


def test_a_download_reports_its_progress_against_the_size_the_portal_says(tmp_path):
    seen = []
    with client(lambda request: httpx.Response(200, content=b"x" * 200_000)) as portal:
        portal.download(f"{PORTAL}/api/v1/data/signed/3.txt", tmp_path / "3.txt",
                        progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (200_000, 200_000) and len(seen) >= 2
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_a_refused_download_leaves_no_file(tmp_path):
    with client(lambda request: error(409, "tokenizer_not_ready", "run “r” has no tokenizer yet")) as portal:
        with pytest.raises(PortalRefused, match="no tokenizer yet"):
            portal.download(f"{PORTAL}/api/v1/runs/r/tokenizer.json", tmp_path / "tokenizer.json", authorize=True)
    assert not (tmp_path / "tokenizer.json").exists()


def test_client_mode_follows_the_dial_back_unless_the_run_or_the_volunteer_decides():
    direct, relayed = Reachability("direct", "dialed"), Reachability("relayed", "through a relay")
    nowhere = Reachability("none", "neither")
    assert client_mode_choose("auto", "auto", nowhere)[0] is True
    assert client_mode_choose("auto", "auto", direct)[0] is False
    assert client_mode_choose("auto", "auto", relayed)[0] is False, "a relayed path is enough to aggregate"
    assert client_mode_choose("auto", "auto", None) == (True, "reachability not checked")
    assert client_mode_choose("off", "auto", nowhere)[0] is False
    assert client_mode_choose("off", "always", direct)[0] is True  # the organizer's policy wins


def test_the_access_refresher_hands_out_the_joins_token_first_then_refreshes(monkeypatch):
    refusals = multiprocessing.SimpleQueue()
    calls = []

    def fake_refresh(self, session_id):
        calls.append(session_id)
        raise PortalRefused("run_paused", "run “r” is paused by its organizer", 409)

    monkeypatch.setattr(PortalClient, "refresh", fake_refresh)
    refresher = AccessRefresher(PORTAL, TOKEN, 7, ACCESS, refusals)
    assert refresher() == ACCESS and calls == []
    with pytest.raises(PortalRefused):
        refresher()
    assert calls == [7] and refusals.get() == ("run_paused", "run “r” is paused by its organizer")


def test_a_relayed_path_is_used_only_for_rounds_a_relayed_connection_carries():
    """hivemind 1.1.12's daemon resets a relayed connection after 128 KiB: a run with bigger rounds
    puts an agent only a relay reaches in client mode, where it dials out for every round."""
    from peer_agent.model import averaged_bytes
    from peer_agent.protocol import config_from_preset
    from peer_agent.reachability import RELAYED_VECTOR_MAX_BYTES

    relayed = Reachability("relayed", "through a relay")
    assert client_mode_choose("auto", "auto", relayed, RELAYED_VECTOR_MAX_BYTES)[0] is False
    client, why = client_mode_choose("auto", "auto", relayed, averaged_bytes(config_from_preset("tiny")))
    assert client is True and "at most 128 KiB" in why and "10.2 MB" in why
