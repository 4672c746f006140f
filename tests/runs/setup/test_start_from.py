"""A run's start: the run form's "Initial weights" (another run's checkpoint, a folder as save_pretrained
writes it, a Hugging Face model id) checked against the run's architecture and the organizer's rights,
what it makes of the run (its checkpoint of epoch 0, its tokenizer), the agents it refuses, and the
restart of a finished run from its last checkpoint."""

import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone
from hivemind.utils.crypto import RSAPrivateKey

from accounts.models import Notification, User
from accounts.services import token_create
from harness.pretraining import small_config
from peer_agent import __version__
from peer_agent.checkpoint import OPTIMIZER_FILE, checkpoint_metadata, checkpoint_unzip
from peer_agent.join import join_request_signed
from peer_agent.protocol import SWARM_COMPATIBLE_SINCE, DeviceInfo, JoinResponse
from runs.models import Run, RunEvent, RunMembership, TrainingSession
from runs.setup import services
from tests.agent_wire import post
from tests.runs.start_world import checkpoint_of, model_folder, run_form_data, source_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(organizer, tmp_path):
    """A public active run with checkpoints of epochs 3 and 6."""
    run = source_run(organizer)
    checkpoint_of(run, tmp_path, epoch=3, loss=3.0)
    checkpoint_of(run, tmp_path, epoch=6, loss=2.5)
    return run


@pytest.fixture
def oscar_organizes(outsider):
    """The outsider may create runs of his own; he organizes no run of the others'."""
    outsider.user_permissions.add(Permission.objects.get(codename="organize_runs"))
    return User.objects.get(pk=outsider.pk)


def create(client, **changes):
    return client.post(reverse("run-create"), run_form_data(**changes))


def errors_of(response) -> list[str]:
    return [str(error) for error in response.context["form"].errors.get("start_from", [])]


def members(archive: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(archive) as zipped:
        return {name: zipped.read(name) for name in zipped.namelist()}


def test_a_run_starts_from_the_newest_checkpoint_of_another_run_with_its_tokenizer(client_for, organizer, source):
    response = create(client_for(organizer), start_from="source")
    assert response.status_code == 302, errors_of(response)
    run = Run.objects.get(slug="next")
    assert run.started_from == "source@6", "the epoch is pinned: a later checkpoint of the source changes nothing"
    [start] = run.checkpoints.all()
    assert (start.epoch, start.kept, start.loss, start.samples) == (0, True, 2.5, 0)
    copied, original = members(Path(start.file.path)), members(Path(source.checkpoints.get(epoch=6).file.path))
    assert copied["model.safetensors"] == original["model.safetensors"]
    assert copied["config.json"] == original["config.json"] and copied["tokenizer.json"] == original["tokenizer.json"]
    assert OPTIMIZER_FILE not in copied, "a new run's schedule starts afresh: no optimizer state"
    assert run.tokenizer_status == Run.TokenizerStatus.READY
    assert json.loads(run.tokenizer_file.read())["model"]["vocab"] == json.loads(copied["tokenizer.json"])["model"]["vocab"]
    assert run.events.filter(kind=RunEvent.Kind.CONFIG_CHANGED, detail="starts from source@6").exists()


def test_the_start_is_what_the_agent_reads_as_a_checkpoint_of_epoch_0_of_the_new_run(client_for, organizer, source,
                                                                                    tmp_path):
    create(client_for(organizer), start_from="source@3")
    run = Run.objects.get(slug="next")
    directory = checkpoint_unzip(Path(run.checkpoints.get().file.path), tmp_path / "agent")
    metadata = checkpoint_metadata(directory)
    assert (metadata.run_id, metadata.epoch, metadata.loss, metadata.samples) == (run.hivemind_run_id, 0, 3.0, 0)
    from transformers import AlbertForPreTraining

    started = AlbertForPreTraining.from_pretrained(directory).state_dict()
    saved = AlbertForPreTraining.from_pretrained(
        checkpoint_unzip(Path(source.checkpoints.get(epoch=3).file.path), tmp_path / "source")).state_dict()
    assert all((started[name] == saved[name]).all() for name in saved)


def test_a_different_architecture_is_a_form_error_naming_each_mismatch(client_for, organizer, source):
    config = small_config()
    config["model"].update(hidden_size=128, intermediate_size=256)
    response = create(client_for(organizer), config=config, start_from="source")
    assert response.status_code == 200
    assert errors_of(response) == ["Hidden_size: source@6 has 64, the run's model 128.",
                                   "Intermediate_size: source@6 has 128, the run's model 256."]
    assert not Run.objects.filter(slug="next").exists()


@pytest.mark.parametrize(("text", "error"), [
    ("nowhere", "There is no run “nowhere” that you may see."),
    ("source@4", "Run “source” has no checkpoint of epoch 4; it has: 6, 3."),
    ("so urce", "“so urce” is not a run's address (slug, or slug@epoch for one of its checkpoints)."),
    ("a/b/c", "“a/b/c” is neither a Hugging Face model id (owner/name) nor an absolute path."),
    ("/etc", "Only folders under"),
])
def test_a_source_that_cannot_be_had_is_a_form_error(client_for, organizer, source, text, error):
    response = create(client_for(organizer), start_from=text)
    assert response.status_code == 200
    [message] = errors_of(response)
    assert message.startswith(error)
    assert not Run.objects.filter(slug="next").exists()


def test_a_run_without_checkpoints_cannot_be_started_from(client_for, organizer):
    source_run(organizer, slug="empty")
    assert errors_of(create(client_for(organizer), start_from="empty")) == ["Run “empty” has saved no checkpoint yet."]


@pytest.mark.parametrize(("fields", "error"), [
    ({"audience": Run.Audience.MEMBERS}, "There is no run “source” that you may see."),
    ({"status": Run.Status.DRAFT}, "There is no run “source” that you may see."),
    ({"visibility": Run.Visibility.INVITE}, "Run “source” shares its checkpoints only with those who may train in it."),
])
def test_an_outsider_cannot_start_from_the_checkpoint_of_a_run_he_may_not_download(
        client_for, oscar_organizes, source, fields, error):
    Run.objects.filter(pk=source.pk).update(**fields)
    response = create(client_for(oscar_organizes), start_from="source")
    assert errors_of(response) == [error], "a hidden run answers as one that does not exist"
    assert not Run.objects.filter(slug="next").exists()


def test_a_member_of_an_invite_only_run_may_start_from_its_checkpoint(client_for, oscar_organizes, source):
    Run.objects.filter(pk=source.pk).update(visibility=Run.Visibility.INVITE)
    RunMembership.objects.create(run=source, user=oscar_organizes)
    assert create(client_for(oscar_organizes), start_from="source").status_code == 302


def test_a_folder_under_start_models_dir_in_save_pretrained_layout_is_a_source(client_for, organizer, source, settings,
                                                                            tmp_path):
    settings.START_MODELS_DIR = tmp_path / "models"
    model_folder(source, tmp_path / "models" / "albert-small")
    response = create(client_for(organizer), start_from=str(tmp_path / "models" / "albert-small"))
    assert response.status_code == 302, errors_of(response)
    run = Run.objects.get(slug="next")
    assert run.started_from == str(tmp_path / "models" / "albert-small")
    directory = checkpoint_unzip(Path(run.checkpoints.get(epoch=0).file.path), tmp_path / "agent")
    assert checkpoint_metadata(directory).loss is None and not (directory / OPTIMIZER_FILE).exists()

    (tmp_path / "models" / "no-weights").mkdir()
    shutil.copy(tmp_path / "models" / "albert-small" / "config.json", tmp_path / "models" / "no-weights")
    response = create(client_for(organizer), slug="other", start_from=str(tmp_path / "models" / "no-weights"))
    assert errors_of(response) == [f"{tmp_path / 'models' / 'no-weights'} has no tokenizer.json, "
                                   "model.safetensors or pytorch_model.bin."]
    outside = tmp_path / "elsewhere"
    model_folder(source, outside)
    response = create(client_for(organizer), slug="other", start_from=str(outside / ".." / "elsewhere"))
    assert errors_of(response)[0].startswith(f"Only folders under {(tmp_path / 'models').resolve()}")


def test_a_hub_model_id_is_downloaded_and_checked_like_a_folder(client_for, organizer, source, settings, tmp_path,
                                                                monkeypatch):
    """The Hub download is the one thing replaced: tests never reach the network."""
    import huggingface_hub

    settings.START_MODELS_DIR = tmp_path / "models"
    model_folder(source, tmp_path / "hub-copy")
    asked = []

    def snapshot_download(*, repo_id, allow_patterns, cache_dir):
        asked.append((repo_id, cache_dir))
        if repo_id != "someone/albert-small":
            raise huggingface_hub.errors.LocalEntryNotFoundError(f"{repo_id} is not cached and the Hub cannot be reached")
        return str(tmp_path / "hub-copy")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    response = create(client_for(organizer), start_from="someone/albert-small")
    assert response.status_code == 302, errors_of(response)
    assert Run.objects.get(slug="next").started_from == "someone/albert-small"
    assert asked == [("someone/albert-small", tmp_path / "models" / "hub")]

    assert errors_of(create(client_for(organizer), slug="other", start_from="someone/missing")) == [
        "Could not download someone/missing from the Hugging Face Hub (LocalEntryNotFoundError); check the id, "
        "or copy the model into a folder under START_MODELS_DIR."]
    config = small_config()
    config["model"]["num_hidden_layers"] = 3
    assert errors_of(create(client_for(organizer), slug="other", config=config, start_from="someone/albert-small")) == [
        "Num_hidden_layers: someone/albert-small has 2, the run's model 3."]


def test_a_model_of_another_kind_is_refused(client_for, organizer, source, settings, tmp_path):
    settings.START_MODELS_DIR = tmp_path
    model_folder(source, tmp_path / "bert")
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    (tmp_path / "bert" / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    assert errors_of(create(client_for(organizer), start_from=str(tmp_path / "bert"))) == [
        f"Model type: {tmp_path / 'bert'} is “bert”; runs train ALBERT."]


def test_a_draft_checks_its_start_again_when_its_model_is_edited_and_may_drop_it(client_for, organizer, source):
    client = client_for(organizer)
    create(client, start_from="source")
    run = Run.objects.get(slug="next")
    config = small_config()
    config["model"]["embedding_size"] = 16
    response = client.post(reverse("run-edit", args=["next"]), run_form_data(config=config, start_from="source@6"))
    assert errors_of(response) == ["Embedding_size: source@6 has 32, the run's model 16."]

    response = client.post(reverse("run-edit", args=["next"]), run_form_data(config=config))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.started_from == "" and not run.checkpoints.exists()


def test_the_tokenizer_a_run_carries_cannot_be_replaced_while_it_starts_from_it(client_for, organizer, source):
    create(client_for(organizer), start_from="source")
    run = Run.objects.get(slug="next")
    with pytest.raises(services.RunError, match="carries its tokenizer"):
        services.tokenizer_upload(run=run, actor=organizer, json_text=run.tokenizer_file.read().decode())


def test_a_started_run_keeps_its_start(client_for, organizer, source):
    client = client_for(organizer)
    create(client, start_from="source@3")
    run = Run.objects.get(slug="next")
    services.data_file_add(run=run, actor=organizer, name="corpus.txt", content=b"one line\nand another\n")
    services.run_transition(run=run, actor=organizer, action="activate")
    response = client.post(reverse("run-edit", args=["next"]), run_form_data(start_from="source@6"))
    assert response.status_code == 302, "a disabled field keeps its value"
    run.refresh_from_db()
    assert run.started_from == "source@3" and run.checkpoints.get().epoch == 0


def join(client, run: Run, secret: str, version: str):
    request = join_request_signed(RSAPrivateKey(), run=run.slug, agent_version=version,
                                  device=DeviceInfo(kind="cpu", name="test CPU", memory_gb=8))
    return post(client, f"/api/v1/runs/{run.slug}/join", secret, request.model_dump(mode="json", exclude_none=True))


def test_agents_join_a_started_run_with_its_start_as_the_checkpoint_and_older_ones_are_refused(
        client, client_for, organizer, volunteer, source):
    create(client_for(organizer), start_from="source")
    run = Run.objects.get(slug="next")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.ACTIVE, initial_peers=["/ip4/1.2.3.4"],
                                         coordinator_heartbeat_at=timezone.now())
    secret = token_create(user=volunteer, name="laptop")[1]
    refused = join(client, run, secret, "0.11.2")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "agent_outdated"
    assert SWARM_COMPATIBLE_SINCE in refused.json()["error"]["detail"]

    answer = JoinResponse.model_validate(join(client, run, secret, __version__).json())
    served = client.get(answer.checkpoint_url.removeprefix("http://testserver"))
    with zipfile.ZipFile(io.BytesIO(b"".join(served.streaming_content))) as zipped:
        assert json.loads(zipped.read("metadata.json"))["epoch"] == 0


@pytest.fixture
def finished(organizer, volunteer, tmp_path):
    """A finished run a volunteer trained in, with checkpoints of epochs 4 and 8."""
    run = source_run(organizer, slug="finished")
    checkpoint_of(run, tmp_path, epoch=4)
    checkpoint_of(run, tmp_path, epoch=8)
    TrainingSession.objects.create(run=run, user=volunteer, peer_public_key="ssh-rsa AAAA", agent_version=__version__,
                                   access_expires_at=run.created_at)
    services.run_transition(run=run, actor=organizer, action="finish")
    return run


def test_an_organizer_restarts_a_finished_run_from_its_last_checkpoint(client, client_for, organizer, volunteer,
                                                                       finished, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(organizer).post(reverse("run-action", args=["finished", "restart"]), follow=True)
    assert "Run restarted: agents go on from its last checkpoint." in response.content.decode()
    finished.refresh_from_db()
    assert finished.status == Run.Status.ACTIVE
    assert finished.events.filter(kind=RunEvent.Kind.RESTARTED, actor=organizer).exists()
    assert Notification.objects.filter(user=volunteer, kind=Notification.Kind.RUN_RESUMED).exists()

    Run.objects.filter(pk=finished.pk).update(initial_peers=["/ip4/1.2.3.4"], coordinator_heartbeat_at=timezone.now())
    secret = token_create(user=volunteer, name="laptop")[1]
    answer = JoinResponse.model_validate(join(client, finished, secret, __version__).json())
    served = client.get(answer.checkpoint_url.removeprefix("http://testserver"))
    with zipfile.ZipFile(io.BytesIO(b"".join(served.streaming_content))) as zipped:
        assert json.loads(zipped.read("metadata.json"))["epoch"] == 8, "the agents resume from its newest checkpoint"
        assert OPTIMIZER_FILE in zipped.namelist(), "with its optimizer state: training goes on where it stopped"


def test_a_finished_run_without_a_checkpoint_cannot_restart(client_for, organizer):
    run = source_run(organizer, slug="never-saved")
    services.run_transition(run=run, actor=organizer, action="finish")
    response = client_for(organizer).post(reverse("run-action", args=["never-saved", "restart"]), follow=True)
    assert "the run saved no checkpoint to restart from" in response.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED


def test_only_a_finished_run_restarts(organizer, source):
    services.run_transition(run=source, actor=organizer, action="pause")
    with pytest.raises(services.RunError, match="a paused run cannot restart"):
        services.run_transition(run=source, actor=organizer, action="restart")


@pytest.mark.parametrize(("who", "status"), [("volunteer", 403), ("outsider", 403), (None, 302)])
def test_only_its_organizers_restart_a_run(client_for, request, finished, who, status):
    user = request.getfixturevalue(who) if who else None
    assert client_for(user).post(reverse("run-action", args=["finished", "restart"])).status_code == status
    finished.refresh_from_db()
    assert finished.status == Run.Status.FINISHED


def test_the_run_page_offers_the_restart_to_organizers_of_a_finished_run(client_for, organizer, volunteer, finished):
    def page(user) -> str:
        return client_for(user).get(reverse("run-detail", args=["finished"])).content.decode()

    assert "Restart from the last checkpoint" in page(organizer)
    assert "Restart from the last checkpoint" not in page(volunteer)


def test_the_run_page_names_the_start_to_its_organizers_alone(client_for, organizer, volunteer, source):
    """The source may be a run others may not see: its name is not shown to them."""
    create(client_for(organizer), start_from="source@3")
    Run.objects.filter(slug="next").update(status=Run.Status.ACTIVE)

    def page(user) -> str:
        return client_for(user).get(reverse("run-detail", args=["next"])).content.decode()

    assert "Started from the weights of source@3." in page(organizer)
    assert "source@3" not in page(volunteer)
