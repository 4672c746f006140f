"""A run ready for spot checks, and sessions' commitments to check, for the tests of validator workers
(tests/runs/swarm/test_validator_workers.py) and of their stop (tests/test_process_stops.py)."""

from __future__ import annotations

import zlib
from pathlib import Path

import torch

from peer_agent.data import batches, dataset_stream
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig
from peer_agent.spotcheck import data_seed, parameters_fingerprint, step_fingerprint
from peer_agent.tokenizer import tokenizer_load
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


def world_build() -> tuple:
    """A draft run with a trained tokenizer and a text file, its model at initialization, and a validator."""
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


def committed(world, name: str, *, faked: bool = False, cursor: int = 0) -> StepCommitment:
    """A commitment of one step of two micro-batches at the model's parameters, as the agent makes it: its
    stream drawn from the session's public seed; a faked one fingerprints a later part of the stream. A
    ``cursor`` far into the stream makes a check that replays it for as long as a test needs."""
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
                                         steps=[[cursor, 2 * MICRO_BATCH, fingerprint, claimed]])


def state_of(model) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in model.parameters()]




def stored(world, volunteer: str, *, cursor: int = 0) -> tuple[StepCommitment, list[str], list[str]]:
    """A commitment (:func:`committed`) and what a queued check of it carries: the name of the state it is
    checked against, kept in the media storage as the coordinator keeps it, and that state's sketch."""
    run, _, _, model, _ = world
    commitment = committed(world, volunteer, cursor=cursor)
    state = state_of(model)
    name = recompute.state_name(run_pk=run.pk, epoch=EPOCH, state=state)
    recompute.state_write(name, state)
    return commitment, [name], [recompute.state_sketch(run.hivemind_run_id, EPOCH, state)]


def long_check_queue() -> int:
    """Queue, for a validator worker, a check that would replay a session's stream for hours: its step sits
    ten million micro-batches in. Returns the commitment's key."""
    commitment, names, sketches = stored(world_build(), "amina", cursor=10**7)
    recompute.spot_check_task.apply_async((commitment.pk, names, sketches))
    return commitment.pk
