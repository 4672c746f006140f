"""Validator workers (runs/swarm/recompute.py): with ``SPOT_CHECK_WORKERS`` on, the coordinator's validator only
schedules. It keeps each state a check needs in the media storage and queues the check; a worker
recomputes it there and records it once, however many times it was queued. Celery runs the task in the
test's process (tests/conftest.py); the demo runs it on a worker of its own (tests/test_demo.py)."""

from __future__ import annotations

import datetime

import pytest
import torch
from django.core.files.storage import default_storage
from django.utils import timezone

from runs.credit import verification
from runs.models import StepCommitment, TrainingSession
from runs.swarm import recompute
from tests.runs.swarm.validation import EPOCH, committed, state_of, stored, world_build


@pytest.fixture
def world(db, settings):
    settings.SPOT_CHECK_WORKERS = True
    return world_build()


def test_a_check_queued_for_a_worker_recomputes_there_and_counts_once(world):
    run, config, _, model, checks = world
    honest, liar = committed(world, "amina"), committed(world, "liar", faked=True)
    state = state_of(model)
    for commitment in (honest, liar):
        checks._check(run, config, commitment, [state])
    honest.refresh_from_db()
    liar.refresh_from_db()
    assert (honest.outcome, liar.outcome) == ("passed", "failed"), (honest.check_detail, liar.check_detail)
    assert honest.queued_at is not None and liar.queued_at is not None
    name = recompute.state_name(run_pk=run.pk, epoch=EPOCH, state=state)
    assert default_storage.exists(name), "the state is kept where any worker reads it"
    assert torch.equal(recompute.state_read(name)[0], state[0])

    # Queued again after its worker seemed lost, the first check's outcome stands: recorded once.
    checked_at = honest.checked_at
    assert recompute.spot_check_task(honest.pk, [name], [recompute.state_sketch(run.hivemind_run_id, EPOCH, state)]) is None
    StepCommitment.objects.filter(pk=liar.pk).update(outcome=StepCommitment.Outcome.PENDING)
    assert recompute.outcome_record(commitment=liar, distances={0: 0.0}, diverged={}, config=config) == "passed"
    assert recompute.outcome_record(commitment=liar, distances={0: 1.0}, diverged={}, config=config) is None
    honest.refresh_from_db()
    assert honest.checked_at == checked_at


def test_a_queued_check_is_neither_queued_again_nor_given_up_while_its_worker_has_it(world, settings):
    run, _, _, _, _ = world
    commitment = committed(world, "amina")
    StepCommitment.objects.filter(pk=commitment.pk).update(queued_at=timezone.now())
    assert verification.commitments_to_check(run=run, epochs={EPOCH}) == []
    assert verification.commitments_uncheckable(run=run, before_epoch=EPOCH + 5) == 0, "its states are kept for it"

    # Lost: a worker that died with the message leaves the check to be queued again, or given up once the
    # validator no longer holds the epoch.
    lost = timezone.now() - datetime.timedelta(seconds=settings.SPOT_CHECK_REQUEUE_SECONDS + 1)
    StepCommitment.objects.filter(pk=commitment.pk).update(queued_at=lost)
    assert [each.pk for each in verification.commitments_to_check(run=run, epochs={EPOCH})] == [commitment.pk]
    assert verification.commitments_uncheckable(run=run, before_epoch=EPOCH + 5) == 1
    commitment.refresh_from_db()
    assert commitment.outcome == "unchecked"


def test_kept_states_go_once_no_queued_check_needs_them_and_a_check_that_lost_its_state_goes_back(world):
    run, config, _, model, checks = world
    commitment = committed(world, "amina")
    state = state_of(model)
    name = recompute.state_name(run_pk=run.pk, epoch=EPOCH, state=state)
    recompute.state_write(name, state)
    later = recompute.state_name(run_pk=run.pk, epoch=EPOCH + 3, state=state)
    recompute.state_write(later, state)
    StepCommitment.objects.filter(pk=commitment.pk).update(queued_at=timezone.now())

    checks._states_prune(oldest_held=EPOCH + 3)
    assert default_storage.exists(name), "a queued check of its epoch still needs it"
    StepCommitment.objects.filter(pk=commitment.pk).update(outcome=StepCommitment.Outcome.PASSED)
    checks._states_prune(oldest_held=EPOCH + 3)
    assert not default_storage.exists(name) and default_storage.exists(later), "kept: the window's epochs"

    StepCommitment.objects.filter(pk=commitment.pk).update(outcome=StepCommitment.Outcome.PENDING)
    assert recompute.spot_check_task(commitment.pk, [name], [recompute.state_sketch(run.hivemind_run_id, EPOCH, state)]) is None
    commitment.refresh_from_db()
    assert commitment.outcome == "pending" and commitment.queued_at is None, "the validator decides again"


def test_a_stopping_validator_deletes_the_states_no_queued_check_needs(world):
    run, config, _, model, checks = world
    commitment = committed(world, "amina")
    state = state_of(model)
    checks.held[EPOCH] = [state]  # it held the duties
    checks._check(run, config, commitment, [state])
    name = recompute.state_name(run_pk=run.pk, epoch=EPOCH, state=state)
    assert default_storage.exists(name)
    StepCommitment.objects.filter(pk=commitment.pk).update(outcome=StepCommitment.Outcome.PENDING)
    checks.shutdown()
    assert default_storage.exists(name), "a queued check still needs it"
    StepCommitment.objects.filter(pk=commitment.pk).update(outcome=StepCommitment.Outcome.PASSED)
    checks.shutdown()
    assert not default_storage.exists(name)
    checks._published(EPOCH, state)
    assert default_storage.exists(name), "written again for a check that needs it"


def test_a_worker_asked_to_stop_hands_its_check_back_and_the_next_check_records_it(world):
    run = world[0]
    commitment, names, sketches = stored(world, "amina")
    StepCommitment.objects.filter(pk=commitment.pk).update(queued_at=timezone.now())
    recompute._stop_asked(sig="SIGTERM")  # what Celery's warm shutdown sends to the worker's receivers
    try:
        assert recompute.spot_check_task(commitment.pk, names, sketches) is None
    finally:
        recompute._stopping.clear()
    commitment.refresh_from_db()
    assert commitment.outcome == "pending" and commitment.queued_at is None, "handed back, to be queued again"
    assert [each.pk for each in verification.commitments_to_check(run=run, epochs={EPOCH})] == [commitment.pk]

    assert recompute.spot_check_task(commitment.pk, names, sketches) == "passed", "the replay picks up where it stopped"
    commitment.refresh_from_db()
    assert commitment.outcome == "passed"


def test_a_sessions_checks_go_to_the_worker_that_took_its_last_one_until_it_stops_or_falls_behind(world):
    session = committed(world, "amina").session_id
    assert recompute.session_worker(session, "validator1@host") == "validator1@host"
    assert recompute.session_worker(session, "validator2@host") == "validator1@host", "it keeps the session's stream"
    assert recompute.session_worker(session, "validator2@host", take=True) == "validator2@host", "passed on: checked there"
    assert recompute.session_worker(session, "validator1@host") == "validator2@host"

    long_ago = timezone.now() - datetime.timedelta(seconds=recompute.SESSION_KEPT_S + 1)
    TrainingSession.objects.filter(pk=session).update(validator_worker_seen_at=long_ago)
    assert recompute.session_worker(session, "validator1@host") == "validator1@host", "fallen behind: another takes it"

    recompute.sessions_give_up("validator1@host")  # on Celery's worker_shutdown, once the worker stopped
    assert recompute.session_worker(session, "validator2@host") == "validator2@host"


def test_a_worker_passes_a_check_of_another_workers_session_to_that_workers_queue_once(world, monkeypatch):
    commitment, names, sketches = stored(world, "amina")
    recompute.session_worker(commitment.session_id, "validator1@host")
    passed_on = []
    monkeypatch.setattr(recompute.spot_check_task, "apply_async",
                        lambda args, queue: passed_on.append((args, queue.name)))

    def on(worker: str, *args):
        """The task as ``worker`` runs it from the broker (the tests' Celery runs tasks inline, as no worker)."""
        recompute.spot_check_task.push_request(hostname=worker, is_eager=False)
        try:
            return recompute.spot_check_task(*args)
        finally:
            recompute.spot_check_task.pop_request()

    assert on("validator2@host", commitment.pk, names, sketches) is None
    assert passed_on == [((commitment.pk, names, sketches, True), "validator1@host.dq2")]
    commitment.refresh_from_db()
    assert commitment.outcome == "pending"
    # Passed on once, it is checked where it lands, whoever took the session meanwhile.
    recompute.session_worker(commitment.session_id, "validator3@host", take=True)
    assert on("validator1@host", commitment.pk, names, sketches, True) == "passed"
    assert len(passed_on) == 1
