"""Hub sources: checked by the worker when the organizer saves them, streamed to agents less a share held
out by hash, which the evaluation reads. No hub is reachable here: the sources are local folders laid
out as the Hub lays a dataset (Parquet files, a README whose YAML names the configurations), which
``datasets`` reads as it reads a Hub repository."""

import collections
import importlib

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.urls import reverse

from harness.hub_folder import hub_folder_write
from peer_agent.data import dataset_stream
from peer_agent.protocol import RunConfig
from runs.models import Run
from tests.factories import RunFactory


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def documents(tag: str, count: int) -> list[str]:
    return [f"{tag} article {n} begins here. {tag} article {n} goes on." for n in range(count)]


@pytest.fixture
def wikipedia(tmp_path):
    """Like wikimedia/wikipedia: a configuration per language, a train split and no other."""
    return hub_folder_write(tmp_path / "wikipedia", {config: {"train": documents(tag, 600)}
                                                      for config, tag in (("20231101.bn", "bn"), ("20231101.en", "en"))})


@pytest.fixture
def news(tmp_path):
    """One configuration, its files under data/, the text in a column named "content"."""
    folder = tmp_path / "news" / "data"
    folder.mkdir(parents=True)
    for split, count in (("train", 300), ("validation", 40)):
        pq.write_table(pa.table({"content": documents(f"news-{split}", count)}), folder / f"{split}-00000-of-00001.parquet")
    return folder.parent


def run_form(preset: str = "large", **changes) -> dict:
    from runs.setup.forms import RunForm, preset_config

    data = {key: value for key, value in RunForm.initial_from(config=preset_config(preset)).items()
            if value is not None and value is not False}
    data.update(name="Bengali", slug="bengali", description="", visibility="public", **changes)
    return data


def run_created(client, data, capture) -> Run:
    """The organizer posts the run form; the worker's check runs (Celery runs tasks inline in tests)."""
    with capture(execute=True):
        response = client.post(reverse("run-create") + "?preset=large", data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    return Run.objects.get(slug=data["slug"])


def test_a_parquet_hub_source_is_accepted_trained_on_and_its_held_out_share_evaluated(
        client_for, organizer, wikipedia, django_capture_on_commit_callbacks):
    from runs.evaluation.runner import heldout_texts

    run = run_created(client_for(organizer), run_form(data__hub=f"{wikipedia} | 20231101.bn | train | text | 1",
                                                      data__heldout="hash", data__heldout_share="0.1",
                                                      heldout_size="20"), django_capture_on_commit_callbacks)
    assert (run.sources_check, run.sources_error) == ("passed", "")
    config = RunConfig.model_validate(run.config)

    trained = [row["text"] for row in dataset_stream(config, data_files=None, seed=5)]
    held_out = heldout_texts(run, config)

    everything = set(documents("bn", 600))
    assert len(held_out) == 20 and set(held_out) <= everything
    assert not set(held_out) & set(trained), "an agent was sent a held-out document"
    hashed_out = {text for text in everything if config.data.holds_out(text)}
    assert set(trained) == everything - hashed_out, "agents get every document but the held-out share"
    assert 30 <= len(hashed_out) <= 90, "about a tenth of 600 is held out"
    assert set(held_out) <= hashed_out


def test_the_evaluation_reads_the_validation_split_when_the_organizer_chooses_it(
        client_for, organizer, news, django_capture_on_commit_callbacks):
    from runs.evaluation.runner import heldout_texts

    run = run_created(client_for(organizer), run_form(data__hub=f"{news} | | train | content",
                                                      data__heldout="validation_split", validation_split="validation",
                                                      heldout_size="10"), django_capture_on_commit_callbacks)
    assert run.sources_check == "passed", run.sources_error
    config = RunConfig.model_validate(run.config)

    trained = [row["text"] for row in dataset_stream(config, data_files=None, seed=0)]
    assert sorted(trained) == sorted(documents("news-train", 300)), "nothing is held out of the training split"
    assert heldout_texts(run, config) == documents("news-validation", 10)


def test_a_mixture_is_the_same_for_the_same_seed_other_for_another_and_in_its_proportions(wikipedia):
    config = RunConfig.model_validate({"data": {"hub": [
        {"path": str(wikipedia), "name": "20231101.bn", "probability": 0.75},
        {"path": str(wikipedia), "name": "20231101.en", "probability": 0.25}], "heldout_share": 0.05}})

    def first(seed: int, count: int = 400) -> list[str]:
        return [row["text"] for row, _ in zip(dataset_stream(config, data_files=None, seed=seed), range(count))]

    assert first(1) == first(1)
    assert first(1) != first(2)
    languages = collections.Counter(text.split()[0] for text in first(3))
    assert 0.65 < languages["bn"] / 400 < 0.85, languages
    assert not any(config.data.holds_out(text) for text in first(3))


def test_two_sources_are_entered_a_line_each_and_their_probabilities_must_add_up_to_one(
        client_for, organizer, wikipedia, news, django_capture_on_commit_callbacks):
    client = client_for(organizer)
    lines = f"{wikipedia} | 20231101.bn | train | text | 0.7\n{news} | | train | content | 0.2"
    response = client.post(reverse("run-create") + "?preset=large", run_form(data__hub=lines))
    assert "The sources' probabilities add up to 0.9; they must add up to 1." in response.context["form"].errors["data__hub"]

    run = run_created(client, run_form(data__hub=lines.replace("0.2", "0.3")), django_capture_on_commit_callbacks)
    assert run.sources_check == "passed", run.sources_error
    assert [(s["name"], s["text_column"], s["probability"]) for s in run.config["data"]["hub"]] == [
        ("20231101.bn", "text", 0.7), (None, "content", 0.3)]
    page = client.get(reverse("run-edit", args=[run.slug])).content.decode()
    assert f"{news} |  | train | content | 0.3" in page, "the form shows the sources as they were entered"


@pytest.mark.parametrize(("source", "changes", "sentence"), [
    ("oscar | unshuffled_deduplicated_bn", {},
     "needs a loading script (oscar.py), which datasets 4 and later no longer run; choose a dataset stored as Parquet"),
    ("wikipedia | 20231101.xx", {}, "has no configuration “20231101.xx”; it has 20231101.bn, 20231101.en."),
    ("wikipedia", {}, "has several configurations (20231101.bn, 20231101.en); name one."),
    ("wikipedia | 20231101.bn | test", {}, "has no split “test”; it has train."),
    ("wikipedia | 20231101.bn", {"data__heldout": "validation_split"},
     "has no split “validation”; it has train. Hold out documents by hash instead of a validation split."),
    ("wikipedia | 20231101.bn | train | body", {}, "has no column “body”; it has id, title, text."),
    ("missing", {}, "no such dataset could be read"),
])
def test_a_hub_source_that_does_not_load_is_refused_with_a_sentence_naming_the_problem(
        client_for, organizer, wikipedia, source, changes, sentence, django_capture_on_commit_callbacks):
    oscar = wikipedia.parent / "oscar"  # as OSCAR is on the Hub: a loading script beside its name
    oscar.mkdir()
    (oscar / "oscar.py").write_text("import datasets\n")
    client = client_for(organizer)

    run = run_created(client, run_form(data__hub=f"{wikipedia.parent}/{source}", **changes),
                      django_capture_on_commit_callbacks)

    assert run.sources_check == "failed" and sentence in run.sources_error
    assert sentence in client.get(reverse("run-edit", args=[run.slug])).content.decode(), "the form says what is wrong"
    run.tokenizer_status = "ready"
    run.save()
    page = client.post(reverse("run-action", args=[run.slug, "activate"]), follow=True).content.decode()
    assert "do not load" in page and sentence in page
    assert Run.objects.get(pk=run.pk).status == "draft"


def test_a_corrected_source_is_checked_again_and_the_run_may_start(
        client_for, organizer, wikipedia, django_capture_on_commit_callbacks):
    client = client_for(organizer)
    run = run_created(client, run_form(data__hub=f"{wikipedia} | 20231101.xx"), django_capture_on_commit_callbacks)
    assert run.sources_check == "failed"
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("run-edit", args=[run.slug]), run_form(data__hub=f"{wikipedia} | 20231101.bn"))
    run.refresh_from_db()
    assert (run.sources_check, run.sources_error) == ("passed", "")
    run.tokenizer_status = "ready"
    run.save()
    client.post(reverse("run-action", args=[run.slug, "activate"]))
    assert Run.objects.get(pk=run.pk).status == "active"


def test_stored_configs_with_one_flat_hub_dataset_become_a_list_of_sources(db):
    migration = importlib.import_module("runs.migrations.0024_run_sources_check")
    from django.apps import apps

    hub, files = RunFactory(slug="hub-run"), RunFactory(slug="files-run")
    flat = {"path": "someone/corpus", "name": "bn", "split": "train", "text_column": "content"}
    hub.config["data"] = {**{key: value for key, value in hub.config["data"].items()
                             if key not in ("hub", "heldout", "heldout_share")}, "source": "hub", **flat}
    files.config["data"] = {**{key: value for key, value in files.config["data"].items()
                               if key not in ("hub", "heldout", "heldout_share")}, "path": None, "name": None,
                            "split": "train", "text_column": "text"}
    Run.objects.bulk_update([hub, files], ["config"])

    migration.hub_sources_list(apps, None)

    hub_data = RunConfig.model_validate(Run.objects.get(pk=hub.pk).config).data
    assert [source.model_dump() for source in hub_data.hub] == [{**flat, "probability": 1.0}]
    assert hub_data.heldout == "validation_split", "a run evaluated on its validation split keeps being so"
    assert RunConfig.model_validate(Run.objects.get(pk=files.pk).config).data.hub == []
