"""Validator workers (runs/swarm/recompute.py): with ``SPOT_CHECK_WORKERS`` on, the coordinator's validator only
schedules. It keeps each state a check needs in the media storage and queues the check; a worker
recomputes it there and records it once, however many times it was queued. Celery runs the task in the
test's process (tests/conftest.py); the demo runs it on a worker of its own (tests/test_demo.py)."""

from __future__ import annotations

import datetime
import zlib
from pathlib import Path

import pytest
import torch
from django.core.files.storage import default_storage
from django.utils import timezone

from peer_agent.data import batches, dataset_stream
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig
from peer_agent.spotcheck import data_seed, parameters_fingerprint, step_fingerprint
from peer_agent.tokenizer import tokenizer_load
from runs.credit import verification
from runs.models import StepCommitment
from runs.setup import services
from runs.setup.corpus import corpus_lines
from runs.swarm import recompute
from runs.swarm.spotcheck import Validator
from tests.factories import RunFactory, UserFactory
from tests.runs.epochs import session_for

EPOCH = 7
MICRO_BATCH = 4


class Holder:
    """The checkpointer's part a validator reads: the run's tokenizer, ready."""

    ready = True

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer


@pytest.fixture
def world(db, settings):
    settings.SPOT_CHECK_WORKERS = True
    organizer = UserFactory()
    run = RunFactory(status="draft", tokenizer_status="missing", organizers=[organizer])
    services.data_file_add(run=run, actor=organizer, name="corpus.txt",
                           content="\n".join(corpus_lines(n_lines=400)).encode())
    services.tokenizer_train(run_id=run.pk)
    run.refresh_from_db()
    tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
    config = RunConfig.model_validate(run.config)
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        init_seed=zlib.crc32(run.hivemind_run_id.encode()))
    checks = Validator(run_pk=run.pk, run_id=run.hivemind_run_id, slug=run.slug, dht=None, checkpointer=Holder(tokenizer))
    return run, config, tokenizer, model, checks


def committed(world, name: str, *, faked: bool = False) -> StepCommitment:
    """A commitment of one step of two micro-batches at the model's parameters, as the agent makes it: its
    stream drawn from the session's public seed; a faked one fingerprints a later part of the stream."""
    run, config, tokenizer, model, _ = world
    session = session_for(run, name)
    files = [data_file.file.path for data_file in run.data_files.all()]
    seed = data_seed(run.hivemind_run_id, session.pk)
    drawn = batches(tokenizer, config, dataset_stream(config, data_files=files, seed=seed), MICRO_BATCH, seed=seed)
    step = [next(drawn), next(drawn)]
    if faked:
        step = [next(drawn), next(drawn)]
    fingerprint = step_fingerprint(model, step, run.hivemind_run_id, EPOCH)
    claimed = parameters_fingerprint(model, run.hivemind_run_id, EPOCH)
    return StepCommitment.objects.create(session=session, epoch=EPOCH, micro_batch_size=MICRO_BATCH, shuffle_buffer=
                                         config.data.shuffle_buffer, samples=2 * MICRO_BATCH,
                                         steps=[[0, 2 * MICRO_BATCH, fingerprint, claimed]])


def state_of(model) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in model.parameters()]


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
