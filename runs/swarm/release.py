"""Publishing a checkpoint: a directory ``from_pretrained`` and Hub tools accept (the model, the tokenizer,
the model card, no optimizer state), and its upload to the Hugging Face Hub."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

from peer_agent.checkpoint import OPTIMIZER_FILE, checkpoint_unzip
from runs.models import Checkpoint
from runs.swarm.cards import model_card_write

logger = logging.getLogger(__name__)


class ReleaseError(Exception):
    """A publication that cannot go ahead; the message says what to do."""


def checkpoint_publish(*, checkpoint: Checkpoint, directory: Path) -> Path:
    """Write ``checkpoint`` as a model directory into ``directory`` (new or empty), with a card that
    holds the evaluations measured since it was saved."""
    if directory.exists() and any(directory.iterdir()):
        raise ReleaseError(f"{directory} is not empty; publish into a new or empty directory")
    with checkpoint.file.open("rb") as archive:
        checkpoint_unzip(archive, directory)
    (directory / OPTIMIZER_FILE).unlink(missing_ok=True)  # training state: of no use to a model's users
    model_card_write(run=checkpoint.run, checkpoint=checkpoint, directory=directory)
    return directory


def checkpoint_upload(*, directory: Path, repo_id: str, private: bool = False) -> str:
    """Upload a published directory to the Hub repository ``repo_id`` (created if missing) with
    HF_TOKEN; the commit's URL."""
    if not settings.HF_TOKEN:
        raise ReleaseError("set HF_TOKEN (or HF_TOKEN_FILE) to a Hugging Face token with write access to upload")
    from huggingface_hub import HfApi  # only publish_checkpoint --upload needs the Hub client

    api = HfApi(token=settings.HF_TOKEN)
    api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(folder_path=str(directory), repo_id=repo_id, repo_type="model",
                               commit_message=f"Checkpoint {directory.name}, published by the DeDLOC portal")
    logger.info("uploaded %s to %s", directory, repo_id)
    return str(getattr(commit, "commit_url", commit))
