"""The held-out split: documents the portal keeps apart from uploaded files, which no agent is sent."""

import httpx
import pytest

from accounts.services import token_create
from peer_agent.data import dataset_stream
from peer_agent.protocol import JoinResponse, RunConfig
from runs.setup.corpus import corpus_lines
from runs.setup.heldout import LINES_PER_BLOCK, heldout_documents_read, heldout_split
from runs.setup.services import data_file_add
from tests.factories import RunFactory, join_body


def documents_text(count: int) -> str:
    return "\n\n".join(f"doc {n} first line.\ndoc {n} second line." for n in range(count)) + "\n"


def test_documents_are_held_out_evenly_over_the_file_and_the_rest_is_left_whole():
    split = heldout_split(documents_text(40), wanted=4)
    assert split.documents == [f"doc {n} first line.\ndoc {n} second line." for n in (5, 15, 25, 35)]
    kept = split.training_text.split("\n\n")
    assert len(kept) == 36 and "doc 5 first" not in split.training_text and kept[0].startswith("doc 0 first")


def test_a_file_gives_at_most_a_quarter_of_its_documents():
    assert len(heldout_split(documents_text(40), wanted=1000).documents) == 10
    assert heldout_split(documents_text(3), wanted=1000).documents == []


def test_a_file_without_blank_lines_is_held_out_in_blocks_of_lines_and_stays_one_document():
    lines = [f"sentence {n}." for n in range(80)]
    split = heldout_split("\n".join(lines), wanted=2)
    assert [document.splitlines() for document in split.documents] == [lines[16:24], lines[56:64]]
    assert "\n\n" not in split.training_text
    assert split.training_text.splitlines() == lines[:16] + lines[24:56] + lines[64:]


def test_uploads_fill_the_split_up_to_the_runs_held_out_size_and_no_further(db, organizer):
    run = RunFactory(status="draft", organizers=[organizer], heldout_size=15)
    first = data_file_add(run=run, actor=organizer, name="a.txt", content=documents_text(40).encode())
    second = data_file_add(run=run, actor=organizer, name="b.txt", content=documents_text(40).encode())
    third = data_file_add(run=run, actor=organizer, name="c.txt", content=documents_text(40).encode())
    run.refresh_from_db()
    assert run.heldout_documents == 15
    assert len(heldout_documents_read(run.heldout_file.read().decode())) == 15
    assert [f.lines for f in (first, second, third)] == [(40 - 10) * 3 - 1, (40 - 5) * 3 - 1, 40 * 3 - 1]
    details = set(run.events.filter(kind="data").values_list("detail", flat=True))
    assert {"uploaded a.txt (10 documents held out for evaluation)", "uploaded c.txt"} <= details


@pytest.mark.django_db(transaction=True)
def test_no_held_out_line_reaches_an_agent_through_its_join_answer_and_data_links(asgi_server, organizer, volunteer):
    """What the agent really does: join over HTTP, then stream the signed data links with peer_agent.data."""
    lines = [f"{line} #{n}" for n, line in enumerate(corpus_lines(n_lines=2000, seed=3))]  # every line unique
    run = RunFactory(slug="heldout-run", organizers=[organizer], heldout_size=50)
    data_file_add(run=run, actor=organizer, name="corpus.txt", content="\n".join(lines).encode())
    run.refresh_from_db()
    held_out = {line for document in heldout_documents_read(run.heldout_file.read().decode()) for line in document.splitlines()}
    assert len(held_out) == 50 * LINES_PER_BLOCK

    _, secret = token_create(user=volunteer, name="laptop")
    response = httpx.post(f"{asgi_server}/api/v1/runs/heldout-run/join", json=join_body("heldout-run"),
                          headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200, response.text
    answer = JoinResponse.model_validate(response.json())
    stream = dataset_stream(RunConfig.model_validate(answer.config), data_files=answer.data_files, seed=0)
    streamed = [line for document in stream for line in document["text"].splitlines()]
    assert len(streamed) == len(lines) - len(held_out)
    assert set(streamed) | held_out == set(lines)
    assert not set(streamed) & held_out, "an agent was sent held-out text"
    media = httpx.get(f"{asgi_server}/media/{run.heldout_file.name}")
    assert media.status_code == 404, "the held-out file is served by no URL"


def form_data(preset: str = "tiny", **changes) -> dict:
    from runs.setup.forms import RunForm, preset_config

    data = {key: value for key, value in RunForm.initial_from(config=preset_config(preset)).items()
            if value is not None and value is not False}
    data.update(name="Held out", slug="held-out", description="", visibility="public", **changes)
    return data


@pytest.mark.parametrize(("changes", "field", "reason"), [
    ({"heldout_size": 5}, "heldout_size", "greater than or equal to 10"),
    ({"heldout_size": 10**6}, "heldout_size", "less than or equal to 100000"),
    ({"heldout_size": "many"}, "heldout_size", "whole number"),
    ({"validation_split": "train", "data__heldout": "validation_split"}, "validation_split",
     "must differ from the split agents train on (train)"),
    ({"data__heldout_share": "0.9"}, "data__heldout_share", "Must be at most 0.5."),
    ({"validation_split": "v" * 101}, "validation_split", "at most 100 characters"),
])
def test_the_form_refuses_held_out_settings_that_cannot_work_with_a_reason(client_for, organizer, changes, field, reason):
    from django.urls import reverse

    from runs.models import Run

    response = client_for(organizer).post(reverse("run-create") + "?preset=large", form_data("large", **changes))
    assert response.status_code == 200
    assert reason in " ".join(response.context["form"].errors[field])
    assert not Run.objects.exists()


def test_the_held_out_settings_lock_once_the_run_has_started(db, organizer):
    from peer_agent.protocol import RunConfig
    from runs.setup.services import RunError, run_update

    run = RunFactory(organizers=[organizer], heldout_size=100)
    with pytest.raises(RunError, match="heldout_size"):
        run_update(run=run, actor=organizer, name=run.name, description="", visibility=run.visibility,
                   config=RunConfig.model_validate(run.config), heldout_size=50)
    run.refresh_from_db()
    assert run.heldout_size == 100


def test_a_hub_dataset_streams_its_train_split_to_agents_and_its_validation_split_to_the_evaluation(tmp_path):
    """The real loading code on a dataset laid out as on the hub (a split per file), read from disk:
    no hub is reachable here, and ``datasets`` reads a local directory the way it reads a hub repo."""
    import json

    from runs.evaluation.runner import heldout_texts
    from runs.models import Run

    for split, count in (("train", 30), ("validation", 8)):
        rows = [{"id": n, "content": f"{split} doc {n} first line. {split} doc {n} second line."} for n in range(count)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = RunConfig.model_validate({"data": {"hub": [{"path": str(tmp_path), "text_column": "content"}],
                                                "heldout": "validation_split"}})

    trained = [row["text"] for row in dataset_stream(config, data_files=None, seed=0)]
    held_out = heldout_texts(Run(validation_split="validation", heldout_size=5), config)

    assert len(trained) == 30 and all(text.startswith("train doc") for text in trained), "agents get the train split only"
    assert held_out == [f"validation doc {n} first line. validation doc {n} second line." for n in range(5)]
