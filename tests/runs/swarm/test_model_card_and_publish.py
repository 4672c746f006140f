"""Every checkpoint zip carries a model card in the Hub's format; `manage.py publish_checkpoint`
writes a directory transformers loads, and uploads it with huggingface_hub (the one mock: no hub
is reachable here)."""

import zipfile
from unittest import mock

import pytest
import torch
import yaml
from django.core.management import CommandError, call_command

from runs.models import ModelLicense, ProbeScore, RunCredit
from runs.setup.labelled import entity_sets
from runs.setup.probes import probe_add
from tests.factories import UserFactory
from tests.runs.evaluation_world import checkpoint_train
from tests.runs.evaluation_world import evaluation_run as run_with_heldout


@pytest.fixture
def released(organizer, tmp_path):
    """A run with a license, languages, a probe scored at its checkpoint and three volunteers' credit:
    one public, one anonymous, one hidden."""
    run = run_with_heldout(organizer, slug="released", license=ModelLicense.CC_BY_SA, languages=["bn", "en"])
    train, test = entity_sets(n_train=20, n_test=5)
    probe = probe_add(run=run, actor=organizer, name="names", task="tokens", train=train.encode(), test=test.encode())
    people = {
        "public": UserFactory(username="amina", display_name="Amina K."),
        "anonymous": UserFactory(username="rahim", visibility="anonymous"),
        "hidden": UserFactory(username="secretive", display_name="Do Not Name Me", visibility="hidden"),
    }
    for credit, user in zip((300.0, 200.0, 100.0), people.values(), strict=True):
        RunCredit.objects.create(run=run, user=user, credit=credit)
    ProbeScore.objects.create(probe=probe, baseline=True, score=0.25)
    ProbeScore.objects.create(probe=probe, epoch=4, score=0.625)
    with torch.random.fork_rng():
        checkpoint = checkpoint_train(run, tmp_path, epoch=4, steps=2)
    return run, checkpoint, people


def card_of(text: str) -> tuple[dict, str]:
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def test_the_checkpoint_zip_carries_a_hub_model_card_that_names_no_hidden_volunteer(released):
    run, checkpoint, people = released
    with zipfile.ZipFile(checkpoint.file.path) as zipped:
        metadata, body = card_of(zipped.read("README.md").decode())
    assert metadata["language"] == ["bn", "en"] and metadata["license"] == "cc-by-sa-4.0"
    assert metadata["datasets"] == ["corpus.txt"] and metadata["metrics"] == ["f1"]
    assert metadata["library_name"] == "transformers"
    assert "- Amina K.: 300 GFLOP" in body
    assert f"- {people['anonymous'].pseudonym}: 200 GFLOP" in body and "rahim" not in body
    assert "Do Not Name Me" not in body and "secretive" not in body
    assert "and 1 more volunteer who chose not to be named" in body
    assert f"tokens seen: {checkpoint.samples * 64:,}" in body
    assert "| names | " in body and "| 0.6250 | 0.2500 |" in body


def test_publish_writes_a_directory_from_pretrained_loads_with_the_card(released, tmp_path):
    from transformers import AlbertForMaskedLM, AutoTokenizer

    run, checkpoint, _ = released
    target = tmp_path / "release"
    call_command("publish_checkpoint", run.slug, str(checkpoint.epoch), "--to", str(target))
    model = AlbertForMaskedLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    encoded = tokenizer("Rahim eats rice [MASK] noon.", return_tensors="pt")
    assert model(**{k: v for k, v in encoded.items() if k != "token_type_ids"}).logits.shape[-1] == len(tokenizer)
    assert not (target / "optimizer.pt").exists()
    metadata, _ = card_of((target / "README.md").read_text())
    assert metadata["license"] == "cc-by-sa-4.0"


def test_publish_refuses_an_unknown_epoch_and_a_non_empty_directory(released, tmp_path):
    run, checkpoint, _ = released
    with pytest.raises(CommandError, match="no checkpoint of epoch 99; its checkpoints: 4"):
        call_command("publish_checkpoint", run.slug, "99", "--to", str(tmp_path / "x"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(CommandError, match="not empty"):
        call_command("publish_checkpoint", run.slug, "4", "--to", str(tmp_path / "full"))
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_publish_to_the_hub_uploads_the_directory_with_the_configured_token(released, tmp_path, settings):
    run, checkpoint, _ = released
    target = tmp_path / "release"
    settings.HF_TOKEN = ""
    with pytest.raises(CommandError, match="set HF_TOKEN"):
        call_command("publish_checkpoint", run.slug, "4", "--to", str(target), "--hub", "dedloc/bengali-demo")
    settings.HF_TOKEN = "hf_test_token"
    with mock.patch("huggingface_hub.HfApi") as api_class:
        api_class.return_value.upload_folder.return_value.commit_url = "https://huggingface.co/dedloc/bengali-demo/commit/1"
        call_command("publish_checkpoint", run.slug, "4", "--to", str(tmp_path / "second"), "--hub", "dedloc/bengali-demo")
    api_class.assert_called_once_with(token="hf_test_token")
    api = api_class.return_value
    api.create_repo.assert_called_once_with(repo_id="dedloc/bengali-demo", repo_type="model", private=False, exist_ok=True)
    upload = api.upload_folder.call_args.kwargs
    assert upload["folder_path"] == str(tmp_path / "second") and upload["repo_id"] == "dedloc/bengali-demo"
    assert (tmp_path / "second" / "README.md").exists() and (tmp_path / "second" / "config.json").exists()
