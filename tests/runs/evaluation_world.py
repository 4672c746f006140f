"""A run with a real held-out split and real checkpoints of a small ALBERT trained in-process on the
generated corpus: what the evaluation tests (and the probes') evaluate."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

from harness.pretraining import model_pretrain, small_config
from peer_agent.checkpoint import CheckpointMetadata, checkpoint_write
from peer_agent.protocol import RunConfig
from runs.models import Checkpoint, Run
from runs.setup import services
from runs.setup.corpus import corpus_lines
from runs.swarm.checkpoints import CheckpointPolicy, checkpoint_save
from tests.factories import RunFactory

POLICY = CheckpointPolicy(every_epochs=1, every_minutes=None, keep_last=100, keep_every_nth=None)


def evaluation_run(organizer, *, slug: str = "eval-run", lines: int = 4000, heldout_size: int = 60, **fields) -> Run:
    """A draft-then-active run on the generated corpus, its held-out split kept apart, its tokenizer trained."""
    fields.setdefault("hivemind_run_id", RUN_ID if slug == "eval-run" else f"evaluation-{slug}")
    run = RunFactory(slug=slug, status="draft", tokenizer_status="missing", organizers=[organizer], config=small_config(),
                     heldout_size=heldout_size, **fields)
    services.data_file_add(run=run, actor=organizer, name="corpus.txt",
                           content="\n".join(corpus_lines(n_lines=lines)).encode())
    services.tokenizer_train(run_id=run.pk)
    services.run_transition(run=run, actor=organizer, action="activate")
    run.refresh_from_db()
    return run


# The run id the evaluation tests' runs carry: the model's initial weights are drawn from it (init_seed
# below, as the agents draw theirs), so a test's checkpoint is the same on every machine. A factory's
# default id is random, and the spread of held-out scores over ids is wide (bench/heldout_spread.py).
RUN_ID = "evaluation-seed-0"


def checkpoint_train(run: Run, workdir: Path, *, epoch: int, steps: int, batch_size: int = 16) -> Checkpoint:
    """Train the run's model from its initial weights for ``steps`` steps on its training files (what
    the agents get) and save it as the checkpoint of ``epoch``, as the coordinator would."""
    from peer_agent.tokenizer import tokenizer_load

    config = RunConfig.model_validate(run.config)
    tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
    files = [data_file.file.path for data_file in run.data_files.all()]
    model = model_pretrain(config, tokenizer, files, init_seed=zlib.crc32(run.hivemind_run_id.encode()), steps=steps,
                           batch_size=batch_size)
    directory = workdir / f"checkpoint-{epoch}"
    metadata = CheckpointMetadata(run_id=run.hivemind_run_id, epoch=epoch, loss=None, samples=steps * batch_size,
                                  time=time.time())
    checkpoint_write(directory, model=model, tokenizer=tokenizer, optimizer_state={"state": {}}, metadata=metadata)
    return checkpoint_save(run=run, directory=directory, metadata=metadata, policy=POLICY)
