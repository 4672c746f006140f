"""The cheater's playbook against credit, one strategy per test, over the real portal (uvicorn on
loopback) and real websockets. Two honest volunteers have confirmed epochs on the run. After each
cheat the coordinator's monitor does what it does for a peer it never sees in the DHT (it gives up
on the epochs it claimed) and the rollup runs: the cheater has no confirmed credit, ranks below
every honest volunteer on the run's board and the board across runs, and the honest volunteers'
credit is what it was. docs/trust.md names each rule."""

import contextlib
import datetime
import json
import threading
import time

import httpx
import pytest
from hivemind.utils.crypto import RSAPrivateKey
from websockets.sync.client import connect

from accounts.services import token_create
from peer_agent.protocol import RunConfig
from runs.credit.rollup import credit_rollup
from runs.credit.verification import epoch_judge
from runs.models import ContributionEvent, ReportRejection, RunCredit, RunSample, TrainingSession
from runs.setup.compute import SWARM_EPOCH_AHEAD, samples_per_second_ceiling
from tests.factories import RunFactory, UserFactory, join_body, report, session_for

pytestmark = pytest.mark.django_db(transaction=True)

HONEST = {"amina": 2992, "rahim": 2896}  # the demo's honest agents' samples in the issue that started this
SLUG = "honest-run"


@pytest.fixture
def portal(asgi_server, settings):
    """A run where two honest volunteers trained three epochs each, confirmed by the monitor."""
    settings.CREDIT_ROLLUP_SETTLE_SECONDS = 0  # the rollup takes every stored report at once
    run = RunFactory(slug=SLUG)
    an_hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    for name, samples in HONEST.items():
        session = session_for(run, UserFactory(username=name))
        for epoch in (1, 2, 3):
            report(session, samples // 3, epoch=epoch, at=an_hour_ago + datetime.timedelta(minutes=epoch))
    credit_rollup()
    credit = dict(RunCredit.objects.values_list("user__username", "credit"))
    assert set(credit) == set(HONEST) and all(credit.values())
    return {"url": asgi_server, "run": run, "honest_credit": credit}


def cheater_joins(portal: dict, name: str = "mallory", key: RSAPrivateKey | None = None) -> tuple[str, int]:
    """A volunteer signs up, makes a token and joins with a key of their own: the agent token and session."""
    user = UserFactory(username=name)
    _, secret = token_create(user=user, name="forgery")
    answer = httpx.post(f"{portal['url']}/api/v1/runs/{SLUG}/join", json=join_body(SLUG, key),
                        headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return secret, answer.json()["session_id"]


def frame(session_id: int, seq: int, *, samples: int = 10_000_000, epoch: int = 1, speed: float = 1e6,
          sent_at: datetime.datetime | None = None) -> dict:
    sent_at = sent_at or datetime.datetime.now(datetime.UTC)
    return {"type": "report", "session_id": session_id, "seq": seq, "samples": samples, "steps": 1,
            "local_epoch": epoch, "loss": 1.0, "samples_per_second": speed, "sent_at": sent_at.isoformat()}


def send(portal: dict, secret: str, frames: list[dict]) -> list[dict]:
    """Send the frames over one socket, each answered before the next."""
    url = portal["url"].replace("http://", "ws://") + "/ws/agent/"
    answers = []
    with connect(url, additional_headers={"Authorization": f"Bearer {secret}"}, open_timeout=30) as socket:
        for each in frames:
            socket.send(json.dumps(each))
            answers.append(json.loads(socket.recv(timeout=30)))
    return answers


def monitor_gives_up_and_rollup_runs(portal: dict) -> None:
    """The rollup takes the cheat in while it is pending (the boards must not move then either); then
    what the coordinator's monitor does for sessions whose peer never announced anything, once their
    epochs closed long ago (runs.credit.verification), and the credit rollup after it."""
    credit_rollup()
    assert_cheat_earned_nothing(portal)
    claims = ContributionEvent.objects.filter(session__run=portal["run"]).exclude(
        session__user__username__in=HONEST).values_list("local_epoch", "session_id").distinct()
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    for epoch, session_id in claims:
        epoch_judge(run=portal["run"], epoch=epoch, closed_at=long_ago, session_ids=[session_id])
    credit_rollup()


def assert_cheat_earned_nothing(portal: dict, cheater: str = "mallory") -> None:
    run_credit = RunCredit.objects.filter(run=portal["run"], user__username=cheater).first()
    assert run_credit is None or run_credit.credit == 0, "no confirmed credit"
    for board in (f"/api/v1/runs/{SLUG}/leaderboard", "/api/v1/leaderboard"):
        for window in ("all", "24h", "7d"):
            rows = httpx.get(f"{portal['url']}{board}?window={window}", timeout=30).json()
            names = [row["name"] for row in rows]
            if window == "all":
                assert names[:2] == sorted(HONEST, key=HONEST.get, reverse=True), (board, rows)
            assert cheater not in names, f"{cheater} on {board}?window={window}: {rows}"
    credit = dict(RunCredit.objects.filter(run=portal["run"], user__username__in=HONEST)
                  .values_list("user__username", "credit"))
    assert credit == pytest.approx(portal["honest_credit"]), "honest credit is unchanged"


def test_a_self_declared_speed_buys_nothing(portal):
    secret, session = cheater_joins(portal)
    answers = send(portal, secret, [frame(session, seq, speed=1e6) for seq in range(1, 11)])
    assert {answer.get("code") for answer in answers} <= {"speed_beyond_device", "samples_beyond_run_pace",
                                                         "samples_beyond_session_budget", None}
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)


@pytest.mark.parametrize("skew", [datetime.timedelta(minutes=4, seconds=50), -datetime.timedelta(minutes=4, seconds=50)])
def test_clock_skew_at_either_edge_buys_no_time(portal, skew):
    """The budget runs on the portal's clock: a sent_at just inside the tolerated skew, ahead or
    behind, gives a session no more time to have trained in."""
    secret, session = cheater_joins(portal)
    now = datetime.datetime.now(datetime.UTC)
    answers = send(portal, secret, [frame(session, seq, samples=64, speed=16.0, sent_at=now + skew * seq / 10)
                                    for seq in range(1, 11)])
    stored = ContributionEvent.objects.filter(session_id=session).count()
    assert stored <= 10 and all(answer["type"] in ("ack", "error") for answer in answers)
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)


def test_local_epoch_jumps_ahead_of_the_swarm_are_refused_and_earn_nothing(portal):
    RunSample.objects.create(run=portal["run"], global_epoch=3, samples_per_second=32.0, alive_peers=2)
    secret, session = cheater_joins(portal)
    answers = send(portal, secret, [frame(session, 1, samples=64, speed=16.0, epoch=10**6),
                                    frame(session, 2, samples=64, speed=16.0, epoch=3 + SWARM_EPOCH_AHEAD + 1),
                                    frame(session, 3, samples=64, speed=16.0, epoch=4)])
    assert [answer.get("code") for answer in answers] == ["local_epoch_ahead_of_swarm"] * 2 + [None]
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)


def test_huge_and_out_of_order_seqs_share_one_budget(portal):
    """Every accepted frame counts against the session's budget, whatever its seq: late seqs are no
    way around it."""
    secret, session = cheater_joins(portal)
    seqs = [2**62, *range(1, 40)]
    send(portal, secret, [frame(session, seq, samples=100_000, speed=100.0) for seq in seqs])
    stored = sum(ContributionEvent.objects.filter(session_id=session).values_list("samples", flat=True))
    opened = TrainingSession.objects.get(pk=session).started_at
    elapsed = (datetime.datetime.now(datetime.UTC) - opened).total_seconds()
    config = RunConfig.model_validate(portal["run"].config)
    # The budget only grows with time: what the portal allowed then is within what it allows now.
    assert stored <= samples_per_second_ceiling(config, "cpu") * elapsed + config.training.target_batch_size
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)


def test_parallel_sockets_on_one_session_earn_nothing(portal):
    secret, session = cheater_joins(portal)
    threads = [threading.Thread(target=send, args=(portal, secret, [frame(session, 100 * n + seq, samples=5_000, speed=50.0)
                                                                    for seq in range(1, 6)])) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)


def test_many_sessions_and_tokens_of_one_volunteer_earn_nothing(portal):
    secret, first = cheater_joins(portal)
    user = TrainingSession.objects.get(pk=first).user
    for n in range(5):
        _, other = token_create(user=user, name=f"forgery {n}")
        answer = httpx.post(f"{portal['url']}/api/v1/runs/{SLUG}/join", json=join_body(SLUG),
                            headers={"Authorization": f"Bearer {other}"}, timeout=30)
        if answer.status_code == 200:
            send(portal, other, [frame(answer.json()["session_id"], seq, samples=64, speed=16.0) for seq in range(1, 4)])
    send(portal, secret, [frame(first, seq, samples=64, speed=16.0) for seq in range(1, 4)])
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)


def test_a_stolen_peer_key_opens_no_session(portal):
    """Peer keys are public in the DHT; joining with an honest peer's key would attribute its signed
    records to the thief's session. The join must be signed by the key's holder."""
    honest_key = RSAPrivateKey()
    user = UserFactory(username="mallory")
    _, secret = token_create(user=user, name="forgery")
    stolen = join_body(SLUG)  # signed with a key of the thief's own
    stolen["peer_public_key"] = honest_key.get_public_key().to_bytes().decode()
    answer = httpx.post(f"{portal['url']}/api/v1/runs/{SLUG}/join", json=stolen,
                        headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "key_proof_invalid")
    assert not TrainingSession.objects.filter(user=user).exists()
    assert_cheat_earned_nothing(portal)


def test_a_refusal_is_never_recorded_against_another_volunteers_session(portal):
    secret, _ = cheater_joins(portal)
    victim = TrainingSession.objects.filter(user__username="amina").first()
    answers = send(portal, secret, [frame(victim.pk, 1, samples=64, speed=16.0)])
    assert answers[0]["code"] == "session_not_found"
    assert not ReportRejection.objects.filter(session=victim).exists()
    assert_cheat_earned_nothing(portal)


def test_one_token_cannot_open_sockets_by_the_thousand(portal, settings):
    settings.AGENT_TOKEN_MAX_SOCKETS = 3
    secret, session = cheater_joins(portal)
    url = portal["url"].replace("http://", "ws://") + "/ws/agent/"
    headers = {"Authorization": f"Bearer {secret}"}
    with contextlib.ExitStack() as held:
        for seq in (1, 2, 3):  # each is served: a report answered
            socket = held.enter_context(connect(url, additional_headers=headers, open_timeout=30))
            socket.send(json.dumps(frame(session, seq, samples=8, speed=16.0)))
            assert json.loads(socket.recv(timeout=30))["type"] == "ack"
        with connect(url, additional_headers=headers, open_timeout=30) as fourth:
            answer = json.loads(fourth.recv(timeout=30))
            assert answer["code"] == "too_many_connections"
    answers = []
    for _ in range(50):  # a closed socket frees its place once the server has seen it close
        with connect(url, additional_headers=headers, open_timeout=30) as again:
            again.send(json.dumps(frame(session, 4, samples=8, speed=16.0)))
            answers.append(json.loads(again.recv(timeout=30)))
        if answers[-1]["type"] == "ack":
            break
        time.sleep(0.1)
    assert answers[-1]["type"] == "ack", answers
    monitor_gives_up_and_rollup_runs(portal)
    assert_cheat_earned_nothing(portal)
