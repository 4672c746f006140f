"""Exactly-once reporting: the spool survives crashes and the reporter resends until acknowledged.

The tests talk to a real ``websockets`` server that keeps the wire contract of ``/ws/agent/``:
it stores each report under ``(session_id, seq)`` before acknowledging it, and acknowledges a
repeated ``seq`` without counting it again.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer_agent.reporter import Reporter
from peer_agent.spool import Spool, SpoolBusy, spool_files, spool_previous_session, spool_read
from tests.peer_agent.fakes import TOKEN, ContractServer, report

REPO = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def server():
    running = ContractServer().start()
    yield running
    running.stop()


def reporter_for(spool_dir: Path, url: str, session_id: int = 1, **kwargs) -> Reporter:
    kwargs = {"backoff_s": 0.05, "max_backoff_s": 0.2, **kwargs}
    return Reporter(spool_dir, TOKEN, session_id=session_id, report_url=url, run="bengali-albert", **kwargs)


def send_reports(reporter: Reporter, count: int, first_samples: int = 10) -> int:
    for i in range(count):
        reporter.report(samples=first_samples + i, steps=1, local_epoch=0, loss=2.5, samples_per_second=8.0)
    return sum(range(first_samples, first_samples + count))


def test_reports_are_stored_once_acknowledged_and_leave_the_spool(tmp_path, server):
    reporter = reporter_for(tmp_path, server.url).start()
    expected = send_reports(reporter, 20)
    assert reporter.close(timeout=10)
    assert server.seqs(1) == list(range(1, 21)) and server.samples(1) == expected
    _header, summary = spool_read(tmp_path / "session-1.jsonl")
    assert summary.pending == {} and summary.acked_samples == expected and summary.last_seq == 20


def test_a_dropped_connection_loses_nothing_and_counts_nothing_twice(tmp_path):
    server = ContractServer(drop_every=7).start()
    try:
        reporter = reporter_for(tmp_path, server.url).start()
        expected = send_reports(reporter, 60)
        assert reporter.close(timeout=15)
    finally:
        server.stop()
    assert server.seqs(1) == list(range(1, 61)) and server.samples(1) == expected
    assert server.connections > 1 and server.duplicates > 0  # it did resend stored-but-unacknowledged reports


def test_reports_made_while_the_portal_is_down_arrive_once_it_is_up(tmp_path):
    server = ContractServer()
    reporter = reporter_for(tmp_path, server.url).start()
    expected = send_reports(reporter, 5)
    time.sleep(0.5)
    assert len(reporter.spool.pending()) == 5
    server.start()
    try:
        assert reporter.flush(timeout=10)
        expected += send_reports(reporter, 3, first_samples=100)
        assert reporter.close(timeout=10)
    finally:
        server.stop()
    assert server.seqs(1) == list(range(1, 9)) and server.samples(1) == expected


CRASHING_AGENT = """
import sys, time
from peer_agent.reporter import Reporter
reporter = Reporter(sys.argv[1], "agt_secret", session_id=41, report_url=sys.argv[2], backoff_s=0.05, max_backoff_s=0.2)
reporter.start()
for i in range(int(sys.argv[3])):
    reporter.report(samples=10 + i, steps=1, local_epoch=0, loss=1.0, samples_per_second=5.0)
time.sleep(60)
"""


def test_a_crashed_agents_reports_are_delivered_exactly_once_by_the_next_start(tmp_path):
    server = ContractServer(ack=False).start()  # stores reports but the acks never arrive
    try:
        child = subprocess.Popen([sys.executable, "-c", CRASHING_AGENT, str(tmp_path), server.url, "12"], cwd=REPO)
        try:
            assert wait_until(lambda: len(server.seqs(41)) == 12, timeout=20)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        server.ack = True
        restarted = reporter_for(tmp_path, server.url, session_id=42).start()  # a new session after the restart
        expected_new = send_reports(restarted, 4)
        assert restarted.close(timeout=10)
        assert not spool_read(tmp_path / "session-41.jsonl")[1].pending
    finally:
        server.stop()
    assert server.seqs(41) == list(range(1, 13)) and server.samples(41) == sum(range(10, 22))
    assert server.duplicates >= 12  # every report was sent again, none counted twice
    assert server.seqs(42) == [1, 2, 3, 4] and server.samples(42) == expected_new


def test_a_reopened_session_continues_its_sequence(tmp_path, server):
    first = reporter_for(tmp_path, server.url, session_id=5).start()
    send_reports(first, 3)
    assert first.close(timeout=10)
    again = reporter_for(tmp_path, server.url, session_id=5).start()
    assert again.report(samples=1, steps=1, local_epoch=0, loss=None, samples_per_second=1.0).seq == 4
    assert again.close(timeout=10)
    assert server.seqs(5) == [1, 2, 3, 4]


def test_a_refused_report_is_dropped_and_the_others_delivered(tmp_path):
    server = ContractServer(errors={3: ("invalid_report", "samples: exceeds what this hardware can do")}).start()
    try:
        reporter = reporter_for(tmp_path, server.url).start()
        send_reports(reporter, 5)
        assert reporter.close(timeout=10)
    finally:
        server.stop()
    assert server.seqs(1) == [1, 2, 4, 5] and reporter.stop_reason is None
    _header, summary = spool_read(tmp_path / "session-1.jsonl")
    assert summary.pending == {} and summary.dropped_reports == 1 and summary.dropped_samples == 12


def test_an_error_that_ends_the_session_becomes_the_stop_reason(tmp_path):
    server = ContractServer(errors={2: ("banned", "you were banned from run “bengali-albert” by its organizers")}).start()
    try:
        reporter = reporter_for(tmp_path, server.url).start()
        send_reports(reporter, 3)
        assert wait_until(lambda: reporter.stop_reason is not None)
        reporter.close(timeout=0.5)
    finally:
        server.stop()
    assert reporter.stop_reason.code == "banned" and not reporter.stop_reason.pause
    assert "banned" in reporter.stop_reason.detail


def test_a_rejected_token_stops_the_session_and_keeps_the_reports(tmp_path, server):
    reporter = Reporter(tmp_path, "agt_wrong", session_id=1, report_url=server.url, backoff_s=0.05).start()
    send_reports(reporter, 2)
    assert wait_until(lambda: reporter.stop_reason is not None)
    assert reporter.stop_reason.code == "unauthorized"
    assert not reporter.close(timeout=0.2)
    assert len(spool_read(tmp_path / "session-1.jsonl")[1].pending) == 2


def test_a_spool_in_use_by_another_agent_is_left_alone(tmp_path):
    spool = Spool.open(tmp_path, 9, report_url="ws://x/ws/agent/")
    with pytest.raises(SpoolBusy):
        Spool.open(tmp_path, 9)
    spool.close()
    Spool.open(tmp_path, 9).close()
    assert spool_files(tmp_path) == [tmp_path / "session-9.jsonl"]


def test_a_restart_replaces_the_newest_session_of_its_run_that_no_agent_holds(tmp_path):
    """``JoinRequest.replaces_session``: what this environment's previous start held (issue 32). A spool still
    locked is another agent's, running beside this one; another run's sessions are not this run's machine."""
    assert spool_previous_session(tmp_path / "none yet", run="bengali") is None
    for session, run in ((3, "bengali"), (5, "bengali"), (7, "english")):
        Spool.open(tmp_path, session, report_url="ws://x/ws/agent/", run=run).close()
    assert spool_previous_session(tmp_path, run="bengali") == 5
    running = Spool.open(tmp_path, 5)
    assert spool_previous_session(tmp_path, run="bengali") == 3, "session 5's agent still runs"
    running.close()
    assert spool_previous_session(tmp_path, run="hindi") is None


def test_a_half_written_last_line_is_cut_off_on_open(tmp_path):
    spool = Spool.open(tmp_path, 3, report_url="ws://x/ws/agent/")
    spool.add(report(3, 1))
    spool.close()
    with open(tmp_path / "session-3.jsonl", "a") as file:
        file.write('{"type": "report", "session_id": 3, "se')
    reopened = Spool.open(tmp_path, 3)
    reopened.add(report(3, 2))
    assert [r.seq for r in reopened.pending()] == [1, 2]
    reopened.close()


operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 1000)),
    st.tuples(st.just("ack"), st.integers(1, 40)),
    st.tuples(st.just("drop"), st.integers(1, 40)),
    st.tuples(st.just("crash"), st.just(0)),
), max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations)
def test_the_spool_never_loses_or_revives_a_report_across_crashes_and_compactions(tmp_path_factory, ops):
    directory = tmp_path_factory.mktemp("spool")
    Spool.compact_after_lines = 5
    try:
        spool = Spool.open(directory, 1, report_url="ws://x/ws/agent/")
        pending: dict[int, int] = {}
        acked = last = 0
        for op, value in ops:
            if op == "add":
                last += 1
                spool.add(report(1, last, value))
                pending[last] = value
            elif op == "ack" and spool.acked(value):
                acked += pending.pop(value)
            elif op == "drop" and spool.dropped(value, "invalid_report", "no"):
                pending.pop(value)
            elif op == "crash":
                spool._file.close()  # no close(): the lock goes with the process, modelled by a new descriptor
                spool._lock_file.close()
                spool = Spool.open(directory, 1)
        assert {r.seq: r.samples for r in spool.pending()} == pending
        assert spool.next_seq == last + 1 and spool.summary().acked_samples == acked
        spool.close()
    finally:
        Spool.compact_after_lines = 2000


def test_a_commitment_waits_for_a_report_of_its_epoch(tmp_path):
    """A step that loads the swarm's state jumps the epoch from 0 to 1; the next step closes epoch 1
    while the agent's tally still holds the first step of epoch 0 (CI, stop 40). The portal refuses a
    commitment that comes with a report of an earlier epoch, so it waits for the report of its own."""
    from peer_agent.join import _Tally
    from peer_agent.protocol import EpochCommitment, StepCommitment

    sketch = "A" * 86 + "=="
    closed = EpochCommitment(epoch=1, micro_batch_size=4, shuffle_buffer=10, signature="AA==",
                             steps=[StepCommitment(cursor=0, samples=4, fingerprint=sketch, parameters=sketch)])
    reporter, commitments = reporter_for(tmp_path, "ws://127.0.0.1:9/"), [closed]
    tally = _Tally(steps=1, local_epoch=0)
    tally = tally.send(reporter, commitments=commitments)
    tally.steps, tally.samples, tally.local_epoch = 1, 4, 1
    tally.send(reporter, commitments=commitments)
    sent = reporter.spool.pending()
    assert [(report.local_epoch, report.commitment and report.commitment.epoch) for report in sent] == [(0, None), (1, 1)]
    assert commitments == []
