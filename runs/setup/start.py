"""A run's start: the weights and tokenizer it trains from instead of random weights. The source is
another run's checkpoint, a folder under START_MODELS_DIR laid out as ``save_pretrained`` writes it, or
a Hugging Face model id; its architecture must be the run's. It becomes the run's checkpoint of epoch 0,
without optimizer state, and its tokenizer the run's. Agents start from the run's newest checkpoint
when no peer online has a newer state (peer_agent/training.py, Trainer._checkpoint_resume), and the
coordinator's checkpointer from this one (runs/swarm/checkpoints.py), so the swarm begins at the
source's weights; evaluation scores it as any checkpoint.

The optimizer state is not carried: a new run has its own schedule (warm-up from step 0) and perhaps
other LAMB settings, and the source's moments belong to another schedule (and a Hub model has none).
A finished run that goes on training keeps its own state instead ("restart", runs/setup/services.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings
from django.core.files import File
from django.db import transaction
from django.utils.translation import gettext as _

from accounts.models import User
from peer_agent.protocol import RunConfig
from runs.access.rules import run_may_download_checkpoints, visible_run
from runs.models import Checkpoint, Run, RunEvent
from runs.setup.services import RunError, run_event_record, tokenizer_store
from runs.setup.tokenization import tokenizer_validate

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
MODEL_FILES = ("config.json", *WEIGHT_FILES, "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
METADATA_FILE = "metadata.json"  # peer_agent/checkpoint.py reads it (checkpoint_metadata)
# The dimensions peer_agent/model.py builds the run's ALBERT with, as AlbertConfig (config.json) names them.
CHECKED_DIMENSIONS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "max_position_embeddings")
HUB_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
RUN_SOURCE = re.compile(r"^(?P<slug>[-a-zA-Z0-9_]+)(@(?P<epoch>\d{1,9}))?$")


class StartError(ValueError):
    """A source a run cannot start from; the message says why, for the organizer."""


@dataclass(frozen=True)
class StartSource:
    """Weights and tokenizer in ``save_pretrained``'s layout: a checkpoint's zip or a folder."""

    label: str  # what Run.started_from records: "slug@epoch", a folder's path or a Hub model id
    names: tuple[str, ...]  # the files of the layout it has
    archive: Path | None = None
    directory: Path | None = None
    loss: float | None = None  # a checkpoint's training loss, shown beside the run's own

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        if self.archive is not None:
            with zipfile.ZipFile(self.archive) as zipped, zipped.open(name) as member:
                yield member
        else:
            with (self.directory / name).open("rb") as member:
                yield member

    def read_text(self, name: str) -> str:
        with self.open(name) as handle:
            return handle.read().decode("utf-8")


def start_source_resolve(*, text: str, user: User, run: Run | None = None) -> StartSource:
    """The source an organizer typed: ``slug`` or ``slug@epoch`` (that run's newest checkpoint, or that
    epoch's), an absolute path under START_MODELS_DIR, or a Hugging Face model id (``owner/name``)."""
    text = text.strip()
    if text.startswith("/"):
        return _folder_source(Path(text))
    if "/" in text:
        if not HUB_MODEL_ID.match(text):
            raise StartError(f"“{text}” is neither a Hugging Face model id (owner/name) nor an absolute path")
        return _hub_source(text)
    match = RUN_SOURCE.match(text)
    if match is None:
        raise StartError(f"“{text}” is not a run's address (slug, or slug@epoch for one of its checkpoints)")
    return _run_source(match["slug"], None if match["epoch"] is None else int(match["epoch"]), user=user, run=run)


def _run_source(slug: str, epoch: int | None, *, user: User, run: Run | None) -> StartSource:
    source = visible_run(slug=slug, user=user)
    if source is None:  # the same answer as for a run that does not exist: a hidden run's name is not confirmed
        raise StartError(f"there is no run “{slug}” that you may see")
    if run is not None and source.pk == run.pk:
        raise StartError("a run cannot start from itself")
    if not run_may_download_checkpoints(run=source, user=user):
        raise StartError(f"run “{slug}” shares its checkpoints only with those who may train in it")
    checkpoints = source.checkpoints.all()
    checkpoint = checkpoints.first() if epoch is None else checkpoints.filter(epoch=epoch).first()
    if checkpoint is None:
        kept = ", ".join(str(epoch) for epoch in checkpoints.values_list("epoch", flat=True)[:10])
        raise StartError(f"run “{slug}” has no checkpoint of epoch {epoch}; it has: {kept}" if kept
                         else f"run “{slug}” has saved no checkpoint yet")
    archive = Path(checkpoint.file.path)
    with zipfile.ZipFile(archive) as zipped:
        names = tuple(name for name in zipped.namelist() if name in (*MODEL_FILES, *TOKENIZER_FILES))
    return StartSource(label=f"{slug}@{checkpoint.epoch}", names=names, archive=archive, loss=checkpoint.loss)


def _folder_source(path: Path, *, label: str | None = None, confined: bool = True) -> StartSource:
    root = Path(settings.START_MODELS_DIR).resolve()
    directory = path.resolve()
    if confined and not directory.is_relative_to(root):
        raise StartError(f"only folders under {root} (START_MODELS_DIR) may be read; copy the model there")
    if not directory.is_dir():
        raise StartError(f"there is no folder {path}")
    names = tuple(name for name in (*MODEL_FILES, *TOKENIZER_FILES) if (directory / name).is_file())
    return StartSource(label=label or str(path), names=names, directory=directory)


def _hub_source(model_id: str) -> StartSource:
    """A Hub model's files, downloaded (config, weights, tokenizer: no other file) into START_MODELS_DIR."""
    from huggingface_hub import snapshot_download  # only a start from a Hub model: a web process seeing none never loads it

    try:
        directory = snapshot_download(repo_id=model_id, allow_patterns=[*MODEL_FILES, *TOKENIZER_FILES],
                                      cache_dir=Path(settings.START_MODELS_DIR) / "hub")
    except (OSError, ValueError) as exc:  # huggingface_hub's errors are OSErrors; a malformed id a ValueError
        logger.info("cannot download %s from the Hub: %r", model_id, exc)
        raise StartError(f"could not download {model_id} from the Hugging Face Hub ({type(exc).__name__}); check the "
                         "id, or copy the model into a folder under START_MODELS_DIR") from None
    return _folder_source(Path(directory), label=model_id, confined=False)


def start_mismatches(source: StartSource, config: RunConfig) -> list[str]:
    """What keeps ``source`` from being the start of a run of ``config``: missing files, and each way its
    model differs from the run's (its vocabulary must be its own tokenizer's); empty when it fits."""
    missing = [name for name in ("config.json", "tokenizer.json") if name not in source.names]
    if not any(name in source.names for name in WEIGHT_FILES):
        missing.append(" or ".join(WEIGHT_FILES))
    if missing:
        return [f"{source.label} has no {', '.join(missing)}"]
    try:
        model = json.loads(source.read_text("config.json"))
        tokenizer = tokenizer_validate(source.read_text("tokenizer.json"))
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"the tokenizer or config.json of {source.label} does not load: {exc}"]
    if not isinstance(model, dict) or model.get("model_type") != "albert":
        kind = model.get("model_type") if isinstance(model, dict) else None
        return [f"model type: {source.label} is “{kind}”; runs train ALBERT"]
    ours = config.model.dimensions()
    found = [f"{name}: {source.label} has {model.get(name)}, the run's model {ours[name]}"
             for name in CHECKED_DIMENSIONS if model.get(name) != ours[name]]
    vocabulary = tokenizer.get_vocab_size(with_added_tokens=True)
    if model.get("vocab_size") != vocabulary:
        found.append(f"vocab_size: the model of {source.label} has {model.get('vocab_size')}, its tokenizer {vocabulary}")
    return found


def run_start_source(run: Run) -> StartSource | None:
    """The start a run already has (its checkpoint of epoch 0), to check a config edit against."""
    start = run.checkpoints.filter(epoch=0).first() if run.started_from else None
    if start is None:
        return None
    with zipfile.ZipFile(start.file.path) as zipped:
        names = tuple(zipped.namelist())
    return StartSource(label=run.started_from, names=names, archive=Path(start.file.path), loss=start.loss)


def _metadata(run: Run, source: StartSource) -> str:
    # CheckpointMetadata's fields (peer_agent/checkpoint.py), which the web tier may not import.
    return json.dumps({"run_id": run.hivemind_run_id, "epoch": 0, "loss": source.loss, "samples": 0, "time": time.time()},
                      indent=2)


@transaction.atomic
def run_start_set(*, run: Run, actor: User, source: StartSource) -> Checkpoint:
    """Make ``source`` (checked with ``start_mismatches``) the draft run's start: its checkpoint of epoch 0,
    kept for good, and its tokenizer."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status != Run.Status.DRAFT:
        raise RunError(_("a run's start cannot change once it has started"))
    _start_remove(run)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "start.zip"
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zipped:  # as peer_agent.checkpoint_zip
            for name in source.names:
                with source.open(name) as member, zipped.open(name, "w", force_zip64=True) as copy:
                    shutil.copyfileobj(member, copy, 2**20)
            zipped.writestr(METADATA_FILE, _metadata(run, source))
        checkpoint = Checkpoint(run=run, epoch=0, loss=source.loss, kept=True, size=archive.stat().st_size)
        with archive.open("rb") as content:
            # Number 0 in its name: the checkpointer numbers the run's own from 1 (runs/swarm/checkpoints.py).
            checkpoint.file.save(f"{run.hivemind_run_id}/000000-epoch0.zip", File(content), save=False)
        checkpoint.save()
    tokenizer_store(run=run, json_text=source.read_text("tokenizer.json"))
    run.started_from = source.label
    run.save(update_fields=["started_from"])
    run_event_record(run=run, actor=actor, kind=RunEvent.Kind.CONFIG_CHANGED, detail=f"starts from {source.label}")
    return checkpoint


@transaction.atomic
def run_start_clear(*, run: Run, actor: User) -> None:
    """The draft run starts from random weights again; the tokenizer it carried stays until replaced."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status != Run.Status.DRAFT:
        raise RunError(_("a run's start cannot change once it has started"))
    if not run.started_from:
        return
    _start_remove(run)
    run.started_from = ""
    run.save(update_fields=["started_from"])
    run_event_record(run=run, actor=actor, kind=RunEvent.Kind.CONFIG_CHANGED, detail="starts from random weights")


def _start_remove(run: Run) -> None:
    for checkpoint in run.checkpoints.filter(epoch=0):
        checkpoint.file.delete(save=False)
        checkpoint.delete()
