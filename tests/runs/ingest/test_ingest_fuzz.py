"""Fuzzing `WS /ws/agent/` through the real consumer: arbitrary text, bytes and near-valid reports.
Whatever arrives, the socket answers each frame, never closes, never credits an invalid frame, and
a second agent connected alongside is unaffected. Derandomized and bounded so CI sees the same
~200 examples in seconds."""

import datetime
import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.services import token_create
from peer_agent.protocol import Report
from portal.asgi import application
from runs.models import ContributionEvent, TrainingSession
from tests.agent_wire import report
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ["type", "session_id", "seq", "samples", "steps", "local_epoch", "loss", "samples_per_second", "sent_at"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8,
)
odd_numbers = st.sampled_from([0, -1, 1.5, 2**31, 2**63, 10**7 + 1, "3", True, None, 1e308, "NaN"])


@st.composite
def near_valid_report(draw, session_id: int) -> str:
    """A plausible report with one or two fields broken, dropped or added."""
    frame = report(session_id, draw(st.integers(min_value=1, max_value=40)))
    for _ in range(draw(st.integers(min_value=1, max_value=2))):
        change = draw(st.sampled_from(["replace", "odd", "drop", "extra"]))
        name = draw(st.sampled_from(FIELDS))
        if change == "replace":
            frame[name] = draw(json_values)
        elif change == "odd":
            frame[name] = draw(odd_numbers)
        elif change == "drop":
            frame.pop(name, None)
        else:
            frame[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    return json.dumps(frame, allow_nan=True)


def frames(session_id: int):
    text = st.text(max_size=200)
    raw_json = json_values.map(json.dumps)
    return st.lists(st.one_of(text, raw_json, st.binary(max_size=200), near_valid_report(session_id)), min_size=1, max_size=4)


def valid(frame: str | bytes) -> Report | None:
    if isinstance(frame, bytes):
        return None
    try:
        return Report.model_validate_json(frame)
    except ValueError:
        return None


ALIVE_SEQ = 10**6  # beyond the fuzzed seqs (1-40)


@pytest.fixture
def bystander(outsider):
    """Another volunteer's agent, connected while the fuzzing goes on."""
    token, secret = token_create(user=outsider, name="bystander")
    other = TrainingSession.objects.create(
        run=RunFactory(), user=outsider, token=token, peer_public_key="ssh-rsa OTHER", agent_version="0.1.0",
        access_expires_at=datetime.datetime.now(datetime.UTC))
    other.secret = secret
    return other


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_no_frame_crashes_the_socket_closes_another_agent_or_earns_unearned_credit(session, bystander, data):
    fresh = TrainingSession.objects.create(
        run=session.run, user=session.user, token=session.token, peer_public_key="ssh-rsa FUZZ", agent_version="0.1.0",
        access_expires_at=session.access_expires_at)
    sent = data.draw(frames(fresh.pk))
    bystander_seq = ContributionEvent.objects.filter(session=bystander).count() + 1

    async def exchange() -> tuple[list[dict], dict, dict]:
        def agent(secret: str) -> WebsocketCommunicator:
            return WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {secret}".encode())])

        fuzzed, other = agent(session.secret), agent(bystander.secret)
        assert (await fuzzed.connect(timeout=10))[0] and (await other.connect(timeout=10))[0]
        answers = []
        for frame in sent:
            # send_input, not send_to, which refuses empty frames
            await fuzzed.send_input({"type": "websocket.receive", "bytes" if isinstance(frame, bytes) else "text": frame})
            answers.append(json.loads(await fuzzed.receive_from(timeout=10)))
        now = datetime.datetime.now(datetime.UTC).isoformat()
        await other.send_to(text_data=json.dumps(report(bystander.pk, bystander_seq, samples=1, sent_at=now)))
        other_answer = json.loads(await other.receive_from(timeout=10))
        await fuzzed.send_to(text_data=json.dumps(report(fresh.pk, ALIVE_SEQ, sent_at=now)))
        alive = json.loads(await fuzzed.receive_from(timeout=10))
        await fuzzed.disconnect()
        await other.disconnect()
        return answers, other_answer, alive

    answers, other_answer, alive = async_to_sync(exchange)()
    assert other_answer == {"type": "ack", "seq": bystander_seq}, "another agent is unaffected"
    assert alive["type"] in {"ack", "error"} and alive["seq"] == ALIVE_SEQ, "the fuzzed connection still answers"
    assert len(answers) == len(sent) and all(answer["type"] in {"ack", "error"} for answer in answers)
    stored_from: dict[tuple[int, int], int] = {}
    for frame, answer in zip(sent, answers, strict=True):
        if answer["type"] == "ack":
            acked = valid(frame)
            assert acked is not None and answer["seq"] == acked.seq, "only a valid report is acknowledged"
            stored_from.setdefault((acked.session_id, acked.seq), acked.samples)
    credited = {(fresh.pk, event.seq): event.samples
                for event in ContributionEvent.objects.filter(session=fresh).exclude(seq=ALIVE_SEQ)}
    assert credited == {key: samples for key, samples in stored_from.items() if key[0] == fresh.pk}, (
        "exactly the acknowledged reports are stored, with their own samples")
