"""Runs to start from: a run of the small model (harness/pretraining.py) with a real tokenizer and real
checkpoints, and the run form's fields for a new run of the same shape."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

from harness.pretraining import small_config
from peer_agent.checkpoint import CheckpointMetadata, checkpoint_write
from peer_agent.protocol import RunConfig
from runs.models import Checkpoint, Run
from runs.setup import services
from runs.setup.corpus import corpus_lines
from runs.setup.forms import RunForm
from tests.factories import RunFactory


def source_run(organizer, *, slug: str = "source", lines: int = 600, **fields) -> Run:
    """An active run of the small model on the generated corpus, its tokenizer trained."""
    run = RunFactory(slug=slug, status="draft", tokenizer_status="missing", organizers=[organizer], config=small_config(),
                     **fields)
    services.data_file_add(run=run, actor=organizer, name="corpus.txt",
                           content="\n".join(corpus_lines(n_lines=lines)).encode())
    services.tokenizer_train(run_id=run.pk)
    services.run_transition(run=run, actor=organizer, action="activate")
    run.refresh_from_db()
    return run


def model_folder(run: Run, directory: Path, *, config: dict | None = None):
    """The run's initial model and tokenizer saved as ``save_pretrained`` writes them (a Hub model's
    layout: no optimizer state, no metadata); the model, for comparisons."""
    from peer_agent.model import model_build
    from peer_agent.tokenizer import tokenizer_load

    tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
    model = model_build(RunConfig.model_validate(config or run.config), len(tokenizer),
                        pad_token_id=tokenizer.pad_token_id, init_seed=zlib.crc32(b"a hub model"))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


def checkpoint_of(run: Run, workdir: Path, *, epoch: int, model=None, loss: float | None = 2.5) -> Checkpoint:
    """A checkpoint of ``epoch`` in the run's format, of ``model`` (default: the run's initial weights),
    saved as the coordinator saves it."""
    from peer_agent.model import model_build
    from peer_agent.tokenizer import tokenizer_load
    from runs.swarm.checkpoints import CheckpointPolicy, checkpoint_save

    tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
    if model is None:
        model = model_build(RunConfig.model_validate(run.config), len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            init_seed=zlib.crc32(run.hivemind_run_id.encode()))
    directory = workdir / f"{run.slug}-checkpoint-{epoch}"
    metadata = CheckpointMetadata(run_id=run.hivemind_run_id, epoch=epoch, loss=loss, samples=epoch * 64, time=time.time())
    checkpoint_write(directory, model=model, tokenizer=tokenizer, optimizer_state={"state": {}}, metadata=metadata)
    policy = CheckpointPolicy(every_epochs=1, every_minutes=None, keep_last=100, keep_every_nth=None)
    return checkpoint_save(run=run, directory=directory, metadata=metadata, policy=policy)


def run_form_data(slug: str = "next", *, config: dict | None = None, **changes) -> dict:
    """The run form as a browser posts it for a new run of the small model (or ``config``)."""
    initial = RunForm.initial_from(config=RunConfig.model_validate(config or small_config()))
    data = {key: value for key, value in initial.items() if value is not None and value is not False}
    data.update(name="Next", slug=slug, description="", visibility="public", start_from="")
    data.update(changes)
    return data
