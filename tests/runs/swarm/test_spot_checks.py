"""Spot checks, the portal's half: commitments stored once and only when signed by the session's
peer key, and credit that rests on checked work (runs/ingest/reports.py, runs/credit/verification.py).
Each test plays a cheater the rule is for; tests/e2e/test_spot_checks_with_agents.py runs the
validator against real agents."""

import random

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from peer_agent.protocol import EpochCommitment, StepCommitment
from peer_agent.spotcheck import commitment_sign
from runs.credit import verification
from runs.ingest.reports import COMMITMENT_WINDOW_EPOCHS, LATE_COMMITMENT
from runs.models import RunEvent, SessionEpoch, TrainingSession
from runs.models import StepCommitment as StoredCommitment
from tests.agent_wire import exchange, report
from tests.runs.epochs import judge, session_for
from tests.runs.epochs import report as reported

FINGERPRINT = "A" * 86 + "=="
TOLERANCE, FAILURES = 0.1, 2


def commitment(epoch: int, *, cursors=(0, 2, 4), samples=8) -> EpochCommitment:
    steps = [StepCommitment(cursor=cursor, samples=samples, fingerprint=FINGERPRINT) for cursor in cursors]
    return EpochCommitment(epoch=epoch, micro_batch_size=8, shuffle_buffer=1000, steps=steps, signature="AA==")


@pytest.fixture
def keyed_session(session):
    """The conftest's session with a real peer key, as a join would have proven."""
    key = RSAPrivateKey()
    session.peer_public_key = key.get_public_key().to_bytes().decode()
    session.save(update_fields=["peer_public_key"])
    session.key = key
    return session


def signed(session, epoch: int, key=None, **options) -> dict:
    made = commitment_sign(commitment(epoch, **options), run_id=session.run.hivemind_run_id, session_id=session.pk,
                           key=key or session.key)
    return made.model_dump(mode="json")


@pytest.mark.django_db(transaction=True)
def test_a_signed_commitment_is_stored_once_and_the_first_one_stands(keyed_session):
    session = keyed_session
    answers = exchange(session.secret, [
        report(session.pk, 1, commitment=signed(session, 1)),
        report(session.pk, 1, commitment=signed(session, 1)),  # a resend: acked, stored once
        report(session.pk, 2, commitment=signed(session, 1, cursors=(1, 3, 5))),  # a second try at epoch 1
    ])
    assert [answer["type"] for answer in answers] == ["ack", "ack", "ack"]
    stored = StoredCommitment.objects.get(session=session)
    assert (stored.epoch, stored.samples, [step[0] for step in stored.steps]) == (1, 24, [0, 2, 4])
    assert stored.outcome == "pending"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forgery", ["another_key", "another_session", "open_epoch"])
def test_a_commitment_not_signed_by_the_sessions_key_or_for_an_open_epoch_is_refused_whole(keyed_session, forgery):
    session = keyed_session
    if forgery == "another_key":
        frame = signed(session, 1, key=RSAPrivateKey())
    elif forgery == "another_session":  # a signature copied from another session of the same peer
        frame = commitment_sign(commitment(1), run_id=session.run.hivemind_run_id, session_id=session.pk + 1,
                                key=session.key).model_dump(mode="json")
    else:
        frame = signed(session, 3)  # the report is of epoch 2: epoch 3 has not closed
    answers = exchange(session.secret, [report(session.pk, 1, commitment=frame)])
    assert (answers[0]["type"], answers[0]["code"]) == ("error", "invalid_commitment")
    assert not StoredCommitment.objects.exists()


@pytest.fixture
def run(db):
    from tests.factories import RunFactory

    return RunFactory()


def committed(session, epoch: int, samples: int) -> StoredCommitment:
    return StoredCommitment.objects.create(session=session, epoch=epoch, micro_batch_size=4, shuffle_buffer=1000,
                                           steps=[[0, samples, FINGERPRINT]], samples=samples)


def check(stored: StoredCommitment, distance: float | None, *, diverged: float | None = None) -> str:
    """Record a check: ``distance``, the recomputed distance of the step at cursor 0 (None: not drawn);
    ``diverged``: how far from the held state the session said it computed the step at cursor 1, when
    that is beyond what the validator allows."""
    return verification.check_record(commitment=stored, distances={} if distance is None else {0: distance},
                                     tolerance=TOLERANCE, failures_to_suspend=FAILURES,
                                     diverged={} if diverged is None else {1: diverged})


def status(session, epoch: int) -> SessionEpoch:
    return SessionEpoch.objects.get(session=session, epoch=epoch)


def test_an_epoch_is_verified_only_once_its_checked_steps_match(run):
    amina = session_for(run)
    reported(amina, 32, epoch=5, checked=False)
    stored = committed(amina, 5, 32)
    verification.announced_record(session_id=amina.pk, epoch=5, announced=32)
    assert judge(run, 5) == {amina.pk: "provisional"}, "announced and committed, but not checked yet"
    assert status(amina, 5).detail == verification.AWAITING_CHECK
    assert judge(run, 5, closed_minutes_ago=60) == {amina.pk: "provisional"}, "a check can come late: no give-up"

    assert check(stored, 0.004) == "passed"
    assert status(amina, 5).status == "verified"


def test_work_never_committed_to_earns_nothing(run):
    amina = session_for(run)
    reported(amina, 32, epoch=5, checked=False)
    verification.announced_record(session_id=amina.pk, epoch=5, announced=32)
    assert judge(run, 5) == {amina.pk: "provisional"}
    assert judge(run, 5, closed_minutes_ago=60) == {amina.pk: "rejected"}
    assert status(amina, 5).detail == verification.NO_COMMITMENT


def test_reporting_more_than_the_committed_steps_is_flagged(run):
    amina = session_for(run)
    reported(amina, 32, epoch=5, checked=False)
    check(committed(amina, 5, 16), 0.0)
    verification.announced_record(session_id=amina.pk, epoch=5, announced=32)
    assert judge(run, 5) == {amina.pk: "flagged"}
    assert "committed to steps of 16 samples" in status(amina, 5).detail


def test_a_failed_check_flags_the_epoch_and_a_second_suspends_the_session_and_sends_its_credit_to_the_organizer(run):
    rahim = session_for(run, username="rahim")
    for epoch in (4, 5, 6):
        reported(rahim, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=rahim.pk, epoch=epoch, announced=32)
    check(committed(rahim, 4, 32), 0.0)
    judge(run, 4)
    assert status(rahim, 4).status == "verified"

    assert check(committed(rahim, 5, 32), 0.93) == "failed"
    assert status(rahim, 5).status == "flagged"
    assert "0.930 away from its committed fingerprint" in status(rahim, 5).detail
    assert TrainingSession.objects.get(pk=rahim.pk).suspended_at is None, "one failure may be bad luck"

    assert check(committed(rahim, 6, 32), 0.71) == "failed"
    suspended = TrainingSession.objects.get(pk=rahim.pk)
    assert suspended.suspended_at is not None and "2 spot checks failed" in suspended.suspension_reason
    assert set(SessionEpoch.objects.filter(session=rahim).values_list("status", flat=True)) == {"flagged"}, \
        "even the epoch that passed waits for the organizer"
    assert RunEvent.objects.filter(run=run, kind="suspended").exists()

    late = committed(rahim, 7, 32)
    assert late not in verification.commitments_to_check(run=run, epochs={7}), "a suspended session is not checked on"
    # An epoch judged after the suspension is flagged too, even one with nothing to check (seen in CI: the
    # lazy agent's next epoch, with no samples reported yet, was verified).
    verification.announced_record(session_id=rahim.pk, epoch=8, announced=32)
    assert judge(run, 8) == {rahim.pk: "flagged"}


def test_an_epoch_flagged_before_its_commitment_is_judged_off_the_swarm_is_rejected_not_left_to_an_organizer(run):
    """A suspension flags every epoch of the session for its organizer, and a figures flag waits for one too;
    a commitment judged after the flag, too late to be checked or computed off the swarm's state, rejects the
    epoch: accepting the flag would credit work that is not the swarm's (seen in CI: the liar of
    tests/security/test_liar_agents.py, suspended, then sending a dark epoch's commitment late)."""
    rahim = session_for(run, username="rahim")
    for epoch in (4, 5, 6):
        reported(rahim, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=rahim.pk, epoch=epoch, announced=32)
    judge(run, 6)
    assert status(rahim, 6).status == "provisional", "no commitment yet: the dark epoch's is held back"
    check(committed(rahim, 4, 32), 0.93)
    check(committed(rahim, 5, 32), 0.71)
    assert status(rahim, 6).status == "flagged", "the suspension flagged it"

    committed(rahim, 6, 32)
    assert verification.commitments_uncheckable(run=run, before_epoch=7) == 1
    assert status(rahim, 6).status == "rejected"
    assert "no state of epoch 6 was held" in status(rahim, 6).detail
    assert status(rahim, 5).status == "flagged", "a failed check is still the organizer's to decide"

    amina = session_for(run)
    reported(amina, 48, epoch=8, checked=False)
    verification.announced_record(session_id=amina.pk, epoch=8, announced=48)
    stored = committed(amina, 8, 16)
    judge(run, 8)
    assert status(amina, 8).status == "flagged", "reported more than it committed to"
    assert check(stored, None, diverged=0.05) == "diverged"
    assert status(amina, 8).status == "rejected"


@pytest.mark.django_db(transaction=True)
def test_a_suspended_session_is_refused_until_its_organizer_lifts_it(keyed_session):
    session = keyed_session
    verification.session_suspend(session=session, reason="2 spot checks failed")
    answers = exchange(session.secret, [report(session.pk, 1)])
    assert answers[0]["code"] == "session_suspended"

    organizer = session.run.organizers.first() or session.user
    verification.session_unsuspend(session=TrainingSession.objects.get(pk=session.pk), by=organizer)
    assert exchange(session.secret, [report(session.pk, 2)])[0] == {"type": "ack", "seq": 2}


def test_an_epoch_the_validator_could_not_check_earns_nothing_whatever_the_sessions_other_checks(run):
    # Issue 29: a liar computed nothing in "dark" epochs, sent their commitments once the validator had let
    # go of the epoch, and one real step elsewhere vouched for all of them. No epoch vouches for another.
    amina = session_for(run)
    for epoch in (5, 6):
        reported(amina, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=amina.pk, epoch=epoch, announced=32)
    committed(amina, 5, 32)
    verification.commitments_uncheckable(run=run, before_epoch=6)
    assert judge(run, 5) == {amina.pk: "rejected"}
    assert "no state of epoch 5 was held" in status(amina, 5).detail

    check(committed(amina, 6, 32), 0.002)
    assert status(amina, 6).status == "verified"
    assert status(amina, 5).status == "rejected", "a pass in another epoch vouches for nothing"


def test_a_step_computed_away_from_the_collaboration_earns_nothing_and_is_not_held_against_the_session(run):
    # An honest peer whose averaging round failed stepped alone: it said so with its parameters' sketch.
    amina = session_for(run)
    for epoch in (4, 5, 6, 7):
        reported(amina, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=amina.pk, epoch=epoch, announced=32)
    for epoch in (4, 5, 6):
        assert check(committed(amina, epoch, 32), None, diverged=0.04) == "diverged"
        assert status(amina, epoch).status == "rejected", "work that cannot be checked earns nothing"
    assert "1 of 1 micro-batches were computed at parameters other than the collaboration's (up to 0.040 away" \
        in status(amina, 4).detail
    assert TrainingSession.objects.get(pk=amina.pk).suspended_at is None, "three of them, and no suspension"
    assert not SessionEpoch.objects.filter(session=amina, status="flagged").exists()

    assert check(committed(amina, 7, 32), 0.003) == "passed", "back with the swarm"
    assert status(amina, 7).status == "verified"
    assert status(amina, 4).status == "rejected", "a later pass does not vouch for a step computed elsewhere"


def test_divergence_shields_nothing_a_step_computed_elsewhere_earns_nothing_even_when_not_drawn(run):
    # Issue 29's divergence shield: faked steps labelled "computed elsewhere", one real step drawn and
    # passed. Before, the epoch was verified whole unless a faked step was drawn.
    rahim = session_for(run, username="rahim")
    reported(rahim, 32, epoch=5, checked=False)
    verification.announced_record(session_id=rahim.pk, epoch=5, announced=32)
    assert check(committed(rahim, 5, 32), 0.001, diverged=0.05) == "diverged"
    assert status(rahim, 5).status == "rejected"


def test_a_cheater_cannot_hide_a_faked_step_behind_a_step_computed_elsewhere(run):
    rahim = session_for(run, username="rahim")
    for epoch in (5, 6):
        reported(rahim, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=rahim.pk, epoch=epoch, announced=32)
    # One faked step said to be computed at the held state, one said to be computed elsewhere: the first fails.
    mixed = committed(rahim, 5, 32)
    outcome = verification.check_record(commitment=mixed, distances={0: 0.9}, diverged={4: 0.05},
                                        tolerance=TOLERANCE, failures_to_suspend=FAILURES)
    assert outcome == "failed" and status(rahim, 5).status == "flagged"
    assert "micro-batch 0 recomputed 0.900" in status(rahim, 5).detail
    # Every faked step said to be computed elsewhere: no suspension, but no credit either.
    assert check(committed(rahim, 6, 32), None, diverged=3.0) == "diverged"
    assert status(rahim, 6).status == "rejected"


@pytest.mark.django_db(transaction=True)
def test_a_commitment_sent_after_the_deadline_is_stored_unchecked_and_earns_nothing(keyed_session):
    from runs.ingest.reports import COMMITMENT_WINDOW_EPOCHS
    from runs.models import RunSample

    session = keyed_session
    # The monitor's reading: the swarm is at epoch 20.
    RunSample.objects.create(run=session.run, global_epoch=20, samples_per_second=40.0, alive_peers=2)
    answers = exchange(session.secret, [
        report(session.pk, 1, local_epoch=20, commitment=signed(session, 20 - COMMITMENT_WINDOW_EPOCHS - 1)),
        report(session.pk, 2, local_epoch=20, commitment=signed(session, 20 - COMMITMENT_WINDOW_EPOCHS)),
    ])
    assert [answer["type"] for answer in answers] == ["ack", "ack"], "the samples are stored; the late epoch is judged"
    late, in_time = StoredCommitment.objects.filter(session=session).order_by("epoch")
    assert (late.outcome, in_time.outcome) == ("unchecked", "pending")
    assert "after the deadline" in late.check_detail
    verification.announced_record(session_id=session.pk, epoch=late.epoch, announced=32)
    assert judge(session.run, late.epoch) == {session.pk: "rejected"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stall", ["huge_micro_batch", "samples_beyond_the_micro_batch"])
def test_a_commitment_that_would_stall_the_validator_is_refused_whole(keyed_session, stall):
    # Issue 29: the validator replays a session's stream in micro-batches; a commitment of 4,096-sample
    # micro-batches, or of a million samples a step, would hold every session's checks up.
    session = keyed_session
    made = commitment(1)
    if stall == "huge_micro_batch":
        made = made.model_copy(update={"micro_batch_size": 4096})
    else:
        made = commitment(1, samples=1_000_000)
    frame = commitment_sign(made, run_id=session.run.hivemind_run_id, session_id=session.pk, key=session.key)
    answers = exchange(session.secret, [report(session.pk, 1, commitment=frame.model_dump(mode="json"))])
    assert (answers[0]["type"], answers[0]["code"]) == ("error", "invalid_commitment")
    assert not StoredCommitment.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_commitment_beyond_the_sessions_work_is_dropped_and_its_samples_earn_nothing(keyed_session):
    """A commitment at micro-batch 2^48 would have the validator replay the stream for ever: its cursors
    are bounded by twice the samples the session reported. The report's samples are stored, so one
    commitment too far (a resync that dropped many drawn steps) does not leave every later one too far;
    its epoch earns nothing, and the next stands (tests/browser/test_full_story.py's agents after a
    resume had every report refused when the report was refused with its commitment)."""
    session = keyed_session
    far = commitment(1, cursors=(0, 2, 2**48))
    near = commitment(2, cursors=(3, 4, 5))
    answers = exchange(session.secret, [
        report(session.pk, 1, local_epoch=1, commitment=commitment_sign(
            far, run_id=session.run.hivemind_run_id, session_id=session.pk, key=session.key).model_dump(mode="json")),
        report(session.pk, 2, local_epoch=2, commitment=commitment_sign(
            near, run_id=session.run.hivemind_run_id, session_id=session.pk, key=session.key).model_dump(mode="json")),
    ])
    assert [answer["type"] for answer in answers] == ["ack", "ack"], answers
    dropped, kept = StoredCommitment.objects.filter(session=session).order_by("epoch")
    assert (dropped.outcome, dropped.steps, kept.outcome) == ("unchecked", [], "pending")
    assert "further than the 32 samples the session reported" in dropped.check_detail
    assert session.rejections.filter(code="invalid_commitment", detail__contains="further than").exists()
    verification.announced_record(session_id=session.pk, epoch=1, announced=32)
    assert judge(session.run, 1) == {session.pk: "rejected"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("declared, committed, answer", [(None, 8, "ack"), (None, 1, "error"), (16, 16, "ack"),
                                                         (16, 8, "error")],
                         ids=["the-runs", "smaller-than-the-runs", "declared-override", "other-than-declared"])
def test_a_commitment_uses_the_micro_batch_its_session_declared_at_join(keyed_session, declared, committed, answer):
    """Micro-batches of one sample would make every replay as long as possible; an agent's
    --per-device-batch-size override, declared at join (runs/access/sessions.py), is its own to use."""
    session = keyed_session
    session.micro_batch_size = declared
    session.save(update_fields=["micro_batch_size"])
    made = commitment(1).model_copy(update={"micro_batch_size": committed})
    frame = commitment_sign(made, run_id=session.run.hivemind_run_id, session_id=session.pk, key=session.key)
    answers = exchange(session.secret, [report(session.pk, 1, commitment=frame.model_dump(mode="json"))])
    assert answers[0]["type"] == answer, answers
    if answer == "error":
        assert "this session declared when it joined" in answers[0]["detail"]


@pytest.mark.django_db(transaction=True)
def test_the_signature_covers_the_parameters_each_step_was_computed_at(keyed_session):
    session = keyed_session
    parameters = "B" * 86 + "=="
    made = commitment(1).model_copy(update={"steps": [
        StepCommitment(cursor=0, samples=8, fingerprint=FINGERPRINT, parameters=parameters),
        StepCommitment(cursor=2, samples=8, fingerprint=FINGERPRINT)]})
    frame = commitment_sign(made, run_id=session.run.hivemind_run_id, session_id=session.pk, key=session.key)
    moved = frame.model_dump(mode="json")
    moved["steps"][0]["parameters"] = "C" * 86 + "=="  # claimed afterwards, once the drawn steps are known
    answers = exchange(session.secret, [report(session.pk, 1, commitment=moved),
                                        report(session.pk, 1, commitment=frame.model_dump(mode="json"))])
    assert [answer["type"] for answer in answers] == ["error", "ack"]
    assert answers[0]["code"] == "invalid_commitment"
    assert StoredCommitment.objects.get(session=session).steps == [[0, 8, FINGERPRINT, parameters], [2, 8, FINGERPRINT]]


def test_a_step_takes_the_parameters_of_its_steps_first_micro_batch():
    from runs.swarm.recompute import step_parameters

    steps = [[0, 8, FINGERPRINT, "P0"], [1, 8, FINGERPRINT], [2, 8, FINGERPRINT, "P2"], [3, 8, FINGERPRINT]]
    assert [step_parameters(steps, index) for index in range(4)] == ["P0", "P0", "P2", "P2"]
    assert step_parameters([[0, 8, FINGERPRINT]], 0) is None, "an agent before 0.9.0 says nothing"


def test_with_spot_checks_off_the_announced_figures_decide(run):
    run.config["verification"] = {**run.config.get("verification", {}), "spot_checks": False}
    run.save(update_fields=["config"])
    amina = session_for(run)
    reported(amina, 32, epoch=5, checked=False)
    verification.announced_record(session_id=amina.pk, epoch=5, announced=32)
    assert judge(run, 5) == {amina.pk: "verified"}


def test_checks_are_drawn_after_the_commitment_in_proportion_to_each_steps_samples(monkeypatch):
    # Issue 29: drawn uniformly by entry, one huge faked entry among many small real ones was checked
    # with a chance of 1/(n+1) whatever it claimed. Drawn by samples, it is checked as often as its share.
    from runs.swarm import recompute

    assert isinstance(recompute._random, random.SystemRandom), "unpredictable, never seeded"
    # The proportions are checked on a seeded stand-in: the same 4000 draws on every run.
    monkeypatch.setattr(recompute, "_random", random.Random(0))
    samples = [1] * 9 + [9]  # the last entry claims half of the samples
    drawn = [recompute.steps_draw(samples, 1)[0] for _ in range(4000)]
    assert set(drawn) == set(range(10)), "every step can be drawn"
    share = drawn.count(9) / len(drawn)
    assert 0.45 < share < 0.55, share  # 0.5 expected; 4000 draws put it within ±0.05 but once in 10^10
    three = recompute.steps_draw(samples, 3)
    assert len(set(three)) == 3 and three == sorted(three), "distinct steps, in stream order"
    assert recompute.steps_draw([4, 4], 5) == [0, 1], "all of them when there are fewer"


def test_a_suspended_volunteer_cannot_start_a_clean_session_and_only_an_organizer_lifts_it(run, client):
    from django.urls import reverse

    from runs.access.rules import run_join_refusal
    from tests.factories import UserFactory

    rahim = session_for(run, username="rahim")
    verification.session_suspend(session=rahim, reason="2 spot checks failed")
    assert run_join_refusal(run=run, user=rahim.user).code == "session_suspended"

    outsider, organizer = UserFactory(username="mallory"), UserFactory(username="org")
    run.organizers.add(organizer)
    lift = reverse("run-session-unsuspend", args=[run.slug, rahim.pk])
    for user in (outsider, rahim.user):  # neither a stranger nor the suspended volunteer
        client.force_login(user)
        assert client.post(lift).status_code == 403
    assert TrainingSession.objects.get(pk=rahim.pk).suspended_at is not None

    client.force_login(organizer)
    page = client.get(reverse("run-flags", args=[run.slug])).content.decode()
    assert f'id="suspended-{rahim.pk}"' in page and "2 spot checks failed" in page
    assert client.post(lift).status_code == 302
    assert TrainingSession.objects.get(pk=rahim.pk).suspended_at is None
    assert run_join_refusal(run=run, user=rahim.user) is None
    assert RunEvent.objects.filter(run=run, kind="unsuspended", actor=organizer).exists()


def test_a_suspended_sessions_epoch_judged_off_the_swarm_is_rejected_before_the_monitor_closes_it(run):
    """An epoch the monitor has not closed (no record of it read yet) and that a suspension flags is rejected
    when its commitment is then judged off the swarm, and one whose commitment was judged so before the
    suspension is rejected, not flagged: either way an organizer accepting the flags would have credited work
    nobody checked (CI44: the liar of tests/security/test_liar_agents.py, suspended, its dark epoch flagged)."""
    rahim = session_for(run, username="rahim")
    for epoch in (4, 5):
        reported(rahim, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=rahim.pk, epoch=epoch, announced=32)
    for epoch in (6, 8):  # reported, judged, no record of it read yet: the monitor has not closed it
        reported(rahim, 24, epoch=epoch, checked=False)
        judge(run, epoch)
        assert status(rahim, epoch).status == "provisional"
    committed(rahim, 6, 24)
    assert verification.commitments_uncheckable(run=run, before_epoch=7) == 1
    assert status(rahim, 6).status == "provisional", "not closed: it waits for the monitor"
    committed(rahim, 8, 24)

    check(committed(rahim, 4, 32), 0.93)
    check(committed(rahim, 5, 32), 0.71)
    assert status(rahim, 6).status == "rejected", "judged off the swarm before the suspension"
    assert "no state of epoch 6 was held" in status(rahim, 6).detail
    assert status(rahim, 8).status == "flagged", "the suspension flagged it"
    assert verification.commitments_uncheckable(run=run, before_epoch=9) == 1
    assert status(rahim, 8).status == "rejected"
    assert "no state of epoch 8 was held" in status(rahim, 8).detail


def test_a_flagged_epoch_whose_commitment_came_late_is_rejected_by_the_validators_next_cycle(run):
    """The ingest stores a late commitment as unchecked at the door (runs/ingest/reports.py), and no check judges
    its epoch then. CI62: the liar of tests/security/test_liar_agents.py, suspended, sent its dark epoch's late
    commitment in the seconds before the ingest refused its session; the suspension had flagged the epoch, and
    an organizer accepting the flag would have credited work nobody checked."""
    rahim = session_for(run, username="rahim")
    for epoch in (4, 5, 6):
        reported(rahim, 32, epoch=epoch, checked=False)
        verification.announced_record(session_id=rahim.pk, epoch=epoch, announced=32)
    judge(run, 6)
    assert status(rahim, 6).status == "provisional", "no commitment yet"
    check(committed(rahim, 4, 32), 0.93)
    check(committed(rahim, 5, 32), 0.71)
    assert status(rahim, 6).status == "flagged", "the suspension flagged it"
    StoredCommitment.objects.create(
        session=rahim, epoch=6, micro_batch_size=4, shuffle_buffer=1000, steps=[[0, 32, FINGERPRINT]], samples=32,
        outcome="unchecked", check_detail=LATE_COMMITMENT.format(epoch=6, swarm=13, window=COMMITMENT_WINDOW_EPOCHS))
    assert status(rahim, 6).status == "flagged"

    assert verification.flags_settle(run=run) == 1
    assert status(rahim, 6).status == "rejected"
    assert "after the deadline" in status(rahim, 6).detail
    assert status(rahim, 4).status == "flagged", "a failed check's flag stays the organizer's to decide"
    assert verification.flags_settle(run=run) == 0
