"""The checkpoint format on the agent's side: written, zipped and read back; a hostile archive is refused;
what a session resumes from."""

import json
import zipfile
from dataclasses import asdict

import pytest
import torch
from transformers import AlbertForMaskedLM

from peer_agent.checkpoint import (
    CheckpointMetadata,
    checkpoint_metadata,
    checkpoint_unzip,
    checkpoint_write,
    checkpoint_zip,
)
from peer_agent.join import _resume_source
from peer_agent.model import model_build
from peer_agent.optim import Lamb, parameter_groups


def test_a_written_checkpoint_round_trips_through_its_zip(tmp_path, tiny_config, tokenizer):
    model = model_build(tiny_config(), len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    optimizer = Lamb(parameter_groups(model, 0.01))
    metadata = CheckpointMetadata(run_id="dlp-test", epoch=7, loss=2.5, samples=448, time=1.0)
    checkpoint_write(tmp_path / "written", model=model, tokenizer=tokenizer, optimizer_state=optimizer.state_dict(),
                     metadata=metadata)
    checkpoint_zip(tmp_path / "written", tmp_path / "checkpoint.zip")
    directory = checkpoint_unzip(tmp_path / "checkpoint.zip", tmp_path / "read")

    assert checkpoint_metadata(directory) == metadata
    assert torch.load(directory / "optimizer.pt", weights_only=True)["state"]["local_epoch"] == 7
    masked_lm = AlbertForMaskedLM.from_pretrained(directory)
    assert torch.equal(masked_lm.albert.embeddings.word_embeddings.weight, model.albert.embeddings.word_embeddings.weight)


def test_unzipping_refuses_members_outside_the_checkpoint(tmp_path):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zipped:
        zipped.writestr("../escaped.txt", "gotcha")
    with pytest.raises(ValueError, match="outside the checkpoint"):
        checkpoint_unzip(tmp_path / "evil.zip", tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


def test_a_session_resumes_from_the_newer_of_the_runs_checkpoint_and_the_state_kept_at_a_pause(tmp_path):
    def saved(name: str, epoch: int):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "metadata.json").write_text(json.dumps(asdict(
            CheckpointMetadata(run_id="dlp-test", epoch=epoch, loss=None, samples=0, time=1.0))))
        return directory

    checkpoint, kept = saved("checkpoint", 4), saved("paused-state", 9)
    assert _resume_source(lambda: checkpoint, kept) == kept, "the pause came after the run's last checkpoint"
    assert _resume_source(lambda: saved("newer", 12), kept).name == "newer"
    assert _resume_source(None, kept) == kept, "a run without checkpoints"
    assert _resume_source(lambda: checkpoint, tmp_path / "nothing-kept") == checkpoint
    assert _resume_source(lambda: None, tmp_path / "nothing-kept") is None, "fresh weights"
    (tmp_path / "cut-short").mkdir()  # a crash while saving: no metadata
    assert _resume_source(lambda: checkpoint, tmp_path / "cut-short") == checkpoint
