"""A run's checkpoint on disk: the one format the coordinator writes and the agent resumes from.

A checkpoint is a Hugging Face model directory (``save_pretrained`` of the ``AlbertForPreTraining``
the peers train, so ``AlbertForMaskedLM.from_pretrained`` loads its masked-LM part, and of the
run's tokenizer), plus ``optimizer.pt`` (the LAMB state in ``hivemind.Optimizer.state_dict()``
form, holding the epoch; absent from a run's start, runs/setup/start.py) and ``metadata.json``. The
portal serves it zipped.
"""

from __future__ import annotations

import json
import logging
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hivemind.optim.optimizer import Optimizer
    from transformers import AlbertForPreTraining, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"
METADATA_FILE = "metadata.json"
PAUSED_STATE_DIR = "paused-state"  # in an agent's files of a run: its own state, kept while the run is paused


@dataclass(frozen=True)
class CheckpointMetadata:
    """What a checkpoint is of: the run, its collaboration epoch and how far training had got."""

    run_id: str  # the run's hivemind prefix
    epoch: int
    loss: float | None  # the peers' recent mean training loss, when they published one
    samples: int  # samples the collaboration had processed
    time: float  # unix time of the save


def checkpoint_write(directory: Path, *, model: AlbertForPreTraining, tokenizer: PreTrainedTokenizerFast,
                     optimizer_state: dict, metadata: CheckpointMetadata) -> None:
    """Save a checkpoint into ``directory`` (created if needed)."""
    # transformers loads only to write or read weights: reading metadata and unzipping need torch alone
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its "Writing model shards" bar would cut into the agent's console
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    state = {**optimizer_state, "state": {**optimizer_state["state"], "local_epoch": metadata.epoch}}
    torch.save(state, directory / OPTIMIZER_FILE)
    (directory / METADATA_FILE).write_text(json.dumps(asdict(metadata), indent=2), encoding="utf-8")


def checkpoint_zip(directory: Path, archive: Path) -> None:
    """Zip a checkpoint directory; stored, not deflated: float weights barely compress."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zipped:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                zipped.write(path, path.relative_to(directory))


def checkpoint_unzip(archive: Path, directory: Path) -> Path:
    """Extract a downloaded checkpoint; refuses members that would land outside ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    root = directory.resolve()
    with zipfile.ZipFile(archive) as zipped:
        for name in zipped.namelist():
            if not (root / name).resolve().is_relative_to(root):
                raise ValueError(f"checkpoint member {name!r} points outside the checkpoint")
        zipped.extractall(root)
    return root


def checkpoint_metadata(directory: Path) -> CheckpointMetadata:
    return CheckpointMetadata(**json.loads((directory / METADATA_FILE).read_text(encoding="utf-8")))


@torch.no_grad()
def checkpoint_weights_load(directory: Path, *, model: torch.nn.Module) -> None:
    """Put a checkpoint's weights into ``model``. Those it lacks (a Hub masked-LM model, which a run may
    start from, has no sentence-order head) keep the model's own, which every peer draws from the same
    seed (peer_agent/model.py): ``from_pretrained`` would draw them from each process's random state."""
    # transformers loads only to write or read weights: reading metadata and unzipping need torch alone
    from transformers import AlbertForPreTraining

    saved, loading = AlbertForPreTraining.from_pretrained(directory, output_loading_info=True)
    missing = set(loading["missing_keys"])
    if missing:
        logger.info("The checkpoint has no %s; those keep the run's initial weights", ", ".join(sorted(missing)))
    model.load_state_dict({name: value for name, value in saved.state_dict().items() if name not in missing}, strict=False)


@torch.no_grad()
def checkpoint_load_into(directory: Path, *, model: torch.nn.Module, optimizer: Optimizer) -> int:
    """Put a checkpoint's parameters, and its optimizer state when it has one that lines up, into a
    peer's model and ``hivemind.Optimizer``; returns the epoch the peer continues from. A run's start
    (its checkpoint of epoch 0, runs/setup/start.py) carries no optimizer state."""
    checkpoint_weights_load(directory, model=model)
    epoch = checkpoint_metadata(directory).epoch
    # With an offloaded optimizer hivemind keeps its own copy of the parameters, which it would
    # copy back over the model at the next global step.
    model_params = [param for group in optimizer.param_groups for param in group["params"]]
    offloaded = [param for group in optimizer.opt.param_groups for param in group["params"]]
    for model_param, optimizer_param in zip(model_params, offloaded, strict=True):
        optimizer_param.copy_(model_param)
    if (directory / OPTIMIZER_FILE).exists():
        state = torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        try:
            optimizer.load_state_dict(state)  # also sets the local epoch from state["state"]["local_epoch"]
        except (ValueError, KeyError, RuntimeError) as exc:
            logger.warning("The checkpoint's optimizer state does not fit this model (%s); starting it afresh", exc)
    optimizer.state_averager.local_epoch = epoch
    # What hivemind itself does after downloading a state: the learning-rate schedule follows the epoch.
    optimizer.state_averager._update_scheduler()
    optimizer.tracker.report_local_progress(local_epoch=epoch, samples_accumulated=0)
    if not optimizer.client_mode:
        optimizer.state_averager.state_sharing_priority = epoch
    return epoch
