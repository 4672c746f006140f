"""Verified credit: a session's reported samples for an epoch against what its peer announced in
its signed DHT records; flags for the organizer; judging twice changes nothing."""

import pytest
from django.utils import timezone
from hivemind.optim.progress_tracker import LocalTrainingProgress

from peer_agent.metrics import LocalMetrics
from runs.access.sessions import LIVE_SESSION_SEEN_WITHIN
from runs.credit import verification
from runs.models import RunEvent, SessionEpoch, StepCommitment, TrainingSession
from runs.swarm.monitor import announcements, counted_epochs, peer_key_text, swarm_reading
from tests.factories import RunFactory
from tests.runs.epochs import judge, report, session_for

# The tiny preset: target batch 64, one local step of 8 samples; tolerance 5 %.
TARGET, STEP = 64, 8


@pytest.fixture
def run(db):
    run = RunFactory()
    assert verification.EpochLimits.for_run(run) == verification.EpochLimits(TARGET, STEP)
    return run


def row(session, epoch):
    return SessionEpoch.objects.get(session=session, epoch=epoch)


@pytest.mark.parametrize(("reported", "announced", "status"), [
    (32, 32, "verified"),
    (16, 32, "verified"),  # reporting less than announced is never a problem
    (int(32 * 1.05) + STEP, 32, "verified"),  # within the tolerance and one step counted around a resync
    (int(32 * 1.05) + STEP + 1, 32, "flagged"),
    (64, 32, "flagged"),  # twice what it trained
    (0, 32, "verified"),  # seen training, nothing reported (yet)
])
def test_reported_samples_are_verified_within_the_tolerance_of_what_the_peer_announced(run, reported, announced, status):
    amina = session_for(run)
    if reported:
        report(amina, reported, epoch=5)
    report(amina, 100, epoch=6)  # another epoch's reports do not count toward epoch 5
    verification.announced_record(session_id=amina.pk, epoch=5, announced=announced)
    assert judge(run, 5) == {amina.pk: status}
    judged = row(amina, 5)
    assert (judged.status, judged.reported_samples, judged.announced_samples) == (status, reported, announced)
    assert judged.checked_at is not None
    if status == "flagged":
        assert f"reported {reported} samples" in judged.detail and f"announced {announced}" in judged.detail


@pytest.mark.parametrize("micro_batch_size, status", [(None, "flagged"), (4 * STEP, "verified")],
                         ids=["the-runs-micro-batch", "a-declared-override"])
def test_the_step_counted_around_a_resync_is_the_sessions_own_step(run, micro_batch_size, status):
    """An agent with ``--per-device-batch-size`` 4× the run's declares it at join: one of its steps
    counted around a resync is 4× the run's step, and is no reason to flag it (issue 29)."""
    amina = session_for(run)
    TrainingSession.objects.filter(pk=amina.pk).update(micro_batch_size=micro_batch_size)
    report(amina, int(32 * 1.05) + 4 * STEP, epoch=5)
    verification.announced_record(session_id=amina.pk, epoch=5, announced=32)
    assert judge(run, 5) == {amina.pk: status}


@pytest.mark.parametrize("announced, status", [
    (TARGET + TARGET // 2, "verified"),  # an honest peer whose view of the collaboration lagged
    (2 * TARGET + STEP, "verified"),
    (2 * TARGET + STEP + 1, "flagged"),
    (200, "flagged"),
])
def test_a_share_beyond_what_one_peer_gathers_in_an_epoch_is_flagged_even_if_reports_match(run, announced, status):
    amina = session_for(run)
    report(amina, announced, epoch=2)
    verification.announced_record(session_id=amina.pk, epoch=2, announced=announced)
    assert judge(run, 2) == {amina.pk: status}
    if status == "flagged":
        assert "more than one peer gathers in an epoch (2 × the target batch of 64)" in row(amina, 2).detail


def test_a_report_past_a_progress_record_waits_for_the_peers_own_count_of_the_epoch(run):
    """A peer publishes its count of an epoch after the first step of the next, which waits for the
    averaging round; under load the epoch is judged before it comes. What the monitor read so far is a
    progress record from before the epoch's last steps: short of the reports, but no reason to flag."""
    amina, rahim = session_for(run), session_for(run, "rahim")
    for session in (amina, rahim):
        report(session, 48, epoch=5)
        verification.announced_record(session_id=session.pk, epoch=5, announced=32, final=False)
    assert judge(run, 5) == {amina.pk: "provisional", rahim.pk: "provisional"}
    assert row(amina, 5).detail == verification.AWAITING_COUNT

    verification.announced_record(session_id=amina.pk, epoch=5, announced=48)  # its metrics record: 48, all reported
    verification.announced_record(session_id=rahim.pk, epoch=5, announced=32)  # its own count: 32, but 48 reported
    assert judge(run, 5) == {amina.pk: "verified", rahim.pk: "flagged"}
    assert (row(rahim, 5).announced_samples, row(rahim, 5).announced_final) == (32, True)


def test_a_count_that_never_comes_is_judged_on_what_was_seen(run):
    amina, rahim = session_for(run), session_for(run, "rahim")
    for session in (amina, rahim):
        report(session, 48, epoch=5)
        verification.announced_record(session_id=session.pk, epoch=5, announced=32, final=False)
    TrainingSession.objects.filter(pk=rahim.pk).update(ended_at=timezone.now())
    assert judge(run, 5)[rahim.pk] == "provisional", "a session replaced a moment ago: its last records may be read yet"
    TrainingSession.objects.filter(pk=rahim.pk).update(ended_at=timezone.now() - LIVE_SESSION_SEEN_WITHIN)
    assert judge(run, 5) == {amina.pk: "provisional", rahim.pk: "flagged"}, "an ended session publishes no more"
    assert judge(run, 5, closed_minutes_ago=11)[amina.pk] == "flagged", "nor does one 10 minutes on"


def test_the_monitor_knows_which_figures_are_the_peers_own_counts():
    records = {b"a": metrics(9, 40, 1.0, closed_epochs=[(7, 32), (8, 40)]), b"b": metrics(4, 16, 1.0)}
    assert counted_epochs(records) == {(b"a", 7), (b"a", 8)}


def test_the_largest_announced_figure_is_kept(run):
    amina = session_for(run)
    for announced in (8, 24, 16):
        verification.announced_record(session_id=amina.pk, epoch=3, announced=announced)
    assert row(amina, 3).announced_samples == 24


def test_a_session_never_seen_in_the_dht_stays_provisional_then_is_rejected(run):
    amina = session_for(run)
    report(amina, 32, epoch=4)
    assert judge(run, 4) == {amina.pk: "provisional"}
    assert row(amina, 4).detail == verification.NOT_SEEN_YET and row(amina, 4).checked_at is None

    assert judge(run, 4, closed_minutes_ago=11) == {amina.pk: "rejected"}, "no record can arrive this long after"
    rejected = row(amina, 4)
    assert rejected.detail.startswith("never seen in the DHT") and rejected.checked_at and rejected.decided_by is None

    rahim = session_for(run, "rahim")
    report(rahim, 32, epoch=4)
    TrainingSession.objects.filter(pk=rahim.pk).update(ended_at=timezone.now() - LIVE_SESSION_SEEN_WITHIN)
    assert judge(run, 4)[rahim.pk] == "rejected", "an ended session's peer will not publish any more"


def test_judging_again_changes_nothing_and_late_reports_are_judged_on_the_new_sum(run):
    amina = session_for(run)
    report(amina, 24, epoch=7)
    verification.announced_record(session_id=amina.pk, epoch=7, announced=32)
    judge(run, 7)
    first = row(amina, 7)

    assert judge(run, 7) == {amina.pk: "verified"}
    again = row(amina, 7)
    assert again.checked_at == first.checked_at, "a restarted monitor does not judge twice"
    assert SessionEpoch.objects.filter(session=amina).count() == 1

    report(amina, 8, epoch=7)  # a late report that still agrees
    judge(run, 7)
    assert (row(amina, 7).status, row(amina, 7).reported_samples) == ("verified", 32)
    assert row(amina, 7).checked_at > first.checked_at, "the rollup picks up the new figures"

    report(amina, 32, epoch=7)  # late reports beyond what the peer announced
    judge(run, 7)
    assert (row(amina, 7).status, row(amina, 7).reported_samples) == ("flagged", 64)


def test_a_flag_stays_as_it_was_when_its_figures_do_not_change(run):
    """A restarted coordinator's monitor judges the epochs it finds again: a flagged epoch's figures are the
    same, so its flag is not judged again; new figures update it. A commitment then judged unchecked (a
    restarted validator holds only epochs from its start on) rejects it, as it rejects an epoch not flagged:
    work that could not be checked earns nothing, and accepting the flag would credit it
    (tests/runs/swarm/test_spot_checks.py)."""
    amina = session_for(run)
    report(amina, 64, epoch=2)
    verification.announced_record(session_id=amina.pk, epoch=2, announced=32)
    assert judge(run, 2) == {amina.pk: "flagged"}
    first = row(amina, 2)

    assert judge(run, 2) == {amina.pk: "flagged"}
    assert (row(amina, 2).checked_at, row(amina, 2).detail) == (first.checked_at, first.detail)

    report(amina, 8, epoch=2)  # new figures still update the flag
    judge(run, 2)
    assert (row(amina, 2).status, row(amina, 2).reported_samples) == ("flagged", 72)
    assert row(amina, 2).checked_at > first.checked_at

    StepCommitment.objects.filter(session=amina, epoch=2).update(outcome=StepCommitment.Outcome.UNCHECKED)
    assert judge(run, 2) == {amina.pk: "rejected"}


def test_an_organizers_decision_is_final_and_in_the_audit_log(run, organizer):
    amina = session_for(run)
    report(amina, 64, epoch=1)
    verification.announced_record(session_id=amina.pk, epoch=1, announced=32)
    judge(run, 1)
    flagged = row(amina, 1)
    verification.flag_reject(row=flagged, by=organizer)
    assert (flagged.status, flagged.decided_by, flagged.decided_at is not None) == ("rejected", organizer, True)
    event = RunEvent.objects.get(run=run, kind=verification.EVENT_CREDIT_REJECTED)
    assert event.actor == organizer and "amina's epoch 1" in event.detail and "reported 64, announced 32" in event.detail

    report(amina, 8, epoch=1)
    judge(run, 1)
    assert row(amina, 1).status == "rejected" and row(amina, 1).reported_samples == 64, "decided rows are not judged again"
    with pytest.raises(verification.CreditError):
        verification.flag_accept(row=flagged, by=organizer)

    rahim = session_for(run, "rahim")
    report(rahim, 64, epoch=1)
    verification.announced_record(session_id=rahim.pk, epoch=1, announced=32)
    judge(run, 1)
    verification.flag_accept(row=row(rahim, 1), by=organizer)
    assert row(rahim, 1).status == "accepted"
    assert RunEvent.objects.get(run=run, kind=verification.EVENT_CREDIT_ACCEPTED).actor == organizer


def progress(epoch, samples, client_mode=False, sps=4.0):
    return LocalTrainingProgress(peer_id=b"p", epoch=epoch, samples_accumulated=samples, samples_per_second=sps,
                                 time=1.0, client_mode=client_mode)


def metrics(step, samples, loss, closed_epochs=()):
    return LocalMetrics(step=step, samples_per_second=4.0, samples_accumulated=samples, loss=loss, mini_steps=1,
                        closed_epochs=list(closed_epochs))


def test_the_swarm_reading_follows_hivemind_client_peers_do_not_decide_the_epoch():
    reading = swarm_reading(
        {b"a": progress(5, 16), b"b": progress(5, 8), b"c": progress(6, 40, client_mode=True)},
        {b"a": metrics(5, 32, 4.0), b"b": metrics(5, 24, 6.0), b"c": metrics(4, 8, 9.0)},
    )
    assert (reading.global_epoch, reading.alive_peers, reading.client_peers) == (5, 3, 1)
    assert (reading.samples_accumulated, reading.samples_per_second, reading.loss) == (24, 12.0, 5.0)
    assert swarm_reading({}, {}).global_epoch is None


def test_the_swarm_reading_s_loss_is_that_of_the_peers_in_the_swarm_now():
    """A peer that left keeps its metrics record for 10 minutes, its progress record goes: after a pause
    the old session's last loss (at a later step) is not the swarm's."""
    reading = swarm_reading({b"new": progress(3, 8)}, {b"old": metrics(9, 32, 2.0), b"new": metrics(3, 8, 6.5)})
    assert (reading.global_epoch, reading.loss) == (3, 6.5)


def test_a_metrics_record_counts_toward_the_epoch_the_peer_was_in_before():
    found = announcements({b"a": progress(9, 8)}, {b"a": metrics(9, 40, 1.0), b"b": metrics(4, 16, 1.0)},
                          known_epochs={b"a": {6}})
    # a's progress record is for epoch 9; its metrics of step 9 cover epoch 6, where the monitor last saw it
    assert found == {(b"a", 9): 8, (b"a", 6): 40, (b"b", 3): 16}


def test_a_metrics_record_names_the_counts_of_the_peers_last_epochs():
    """Each epoch gets its own count, whatever the monitor saw before (an agent from 0.3.0 on)."""
    found = announcements({}, {b"a": metrics(9, 40, 1.0, closed_epochs=[(5, 32), (6, 24), (8, 40)])},
                          known_epochs={b"a": {7}})
    assert found == {(b"a", 5): 32, (b"a", 6): 24, (b"a", 8): 40}


@pytest.mark.parametrize("closed_epochs", [[(1, -8)], [(1.0, 8)], [(1, 8, 3)], [(epoch, 8) for epoch in range(17)]],
                         ids=["negative", "float", "triple", "too-many"])
def test_a_malformed_closed_epochs_list_is_refused(closed_epochs):
    with pytest.raises(ValueError):
        metrics(9, 40, 1.0, closed_epochs=closed_epochs)


def test_a_records_subkey_names_the_sessions_peer_key():
    assert peer_key_text(b"[owner:ssh-rsa AAAAB3Nz]") == "ssh-rsa AAAAB3Nz"
    assert peer_key_text(b"some other subkey") is None
