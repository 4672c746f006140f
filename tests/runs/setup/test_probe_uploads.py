"""Uploading a downstream probe: the formats organizers have (CoNLL/WikiANN, CSV), and every bad
upload refused with a form error and nothing stored."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from runs.models import Probe
from runs.setup.corpus import LANGUAGES
from runs.setup.labelled import entity_sets, kind_sets
from runs.setup.probes import LabelledSet, ProbeFormatError, text_parse, tokens_parse
from tests.factories import RunFactory

WIKIANN_TRAIN = "bn:রহিম B-PER\nbn:ঢাকায় B-LOC\nbn:গেল O\n\nen:Sima B-PER\nen:went O\nen:to O\nen:New B-LOC\nen:York I-LOC\n"
WIKIANN_TEST = "en:Rahim B-PER\nen:slept O\n"
CSV_TRAIN = "text,label\nRahim eats rice.,food\n\"Sima reads books, slowly.\",reading\n"
CSV_TEST = "Karim eats fish.,food\n"


@pytest.fixture
def run(organizer):
    return RunFactory(slug="the-run", organizers=[organizer])


def upload(client, *, name="ner", task="tokens", train: bytes | str = WIKIANN_TRAIN, test: bytes | str = WIKIANN_TEST):
    parts = {part: SimpleUploadedFile(f"{part}.txt", content.encode() if isinstance(content, str) else content)
             for part, content in (("train", train), ("test", test))}
    return client.post(reverse("run-probes", kwargs={"slug": "the-run"}), {"name": name, "task": task, **parts})


def test_wikiann_lines_lose_their_language_prefix_and_sentences_split_on_blank_lines():
    sentences = tokens_parse("-DOCSTART- O\n\n" + WIKIANN_TRAIN)
    assert sentences == [(["রহিম", "ঢাকায়", "গেল"], ["B-PER", "B-LOC", "O"]),
                         (["Sima", "went", "to", "New", "York"], ["B-PER", "O", "O", "B-LOC", "I-LOC"])]


def test_conll_2003_columns_between_token_and_label_are_ignored():
    assert tokens_parse("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n") == [(["EU", "rejects"], ["B-ORG", "O"])]


def test_csv_rows_take_quoted_commas_and_an_optional_header():
    assert text_parse(CSV_TRAIN) == [("Rahim eats rice.", "food"), ("Sima reads books, slowly.", "reading")]


def test_the_generated_demo_sets_parse_and_their_test_labels_are_in_train():
    for task, (train, test) in (("tokens", entity_sets(n_train=50, n_test=20)), ("text", kind_sets(n_train=80, n_test=20))):
        train_rows = tokens_parse(train) if task == "tokens" else text_parse(train)
        test_rows = tokens_parse(test) if task == "tokens" else text_parse(test)
        assert len(train_rows) == (50 if task == "tokens" else 80) and len(test_rows) == 20
        assert LabelledSet(task, test_rows).labels <= LabelledSet(task, train_rows).labels


def test_the_demo_entity_test_part_names_only_people_and_cities_the_train_part_never_labels():
    train, test = (tokens_parse(part) for part in entity_sets(n_train=200, n_test=100))
    entities = lambda rows: {token for tokens, tags in rows for token, tag in zip(tokens, tags) if tag != "O"}  # noqa: E731
    assert entities(test) and not entities(test) & entities(train)


def test_the_demo_kind_test_part_likes_only_people_places_and_things_the_train_part_never_does():
    kinds = {code: {"person": language.names, "place": language.cities,
                    "thing": [obj for _, objects in language.actions for obj in objects]}
             for code, language in LANGUAGES.items()}

    def liked(text: str) -> tuple[str, str]:
        """The liked word of a sentence (the longest that fits: "গল্পের বই" before "বই"), and its kind."""
        code = "en" if text.isascii() else "bn"
        fits = [(word, kind) for kind, words in kinds[code].items() for word in words
                if f"like {word} " in text or f"likes {word} " in text or f" {word} ভালোবাস" in text]
        assert fits, text
        return max(fits, key=lambda fit: len(fit[0]))

    train, test = (text_parse(part) for part in kind_sets(n_train=300, n_test=100))
    for rows in (train, test):
        assert all(liked(text)[1] == label for text, label in rows)
    assert {label for _, label in test} == {"person", "place", "thing"}
    train_words = {liked(text)[0] for text, _ in train}
    assert not {liked(text)[0] for text, _ in test} & train_words


def test_an_organizer_uploads_a_wikiann_probe_and_a_csv_probe(client_for, organizer, run):
    client = client_for(organizer)
    assert upload(client).status_code == 302
    assert upload(client, name="topics", task="text", train=CSV_TRAIN, test=CSV_TEST).status_code == 302
    ner, topics = run.probes.order_by("name")
    assert (ner.task, ner.labels, ner.train_examples, ner.test_examples) == ("tokens", ["B-LOC", "B-PER", "I-LOC", "O"], 2, 1)
    assert (topics.task, topics.labels, topics.metric) == ("text", ["food", "reading"], "accuracy")
    assert ner.train_file.read().decode() == WIKIANN_TRAIN
    page = client.get(reverse("run-probes", kwargs={"slug": "the-run"})).content.decode()
    assert "ner" in page and "topics" in page


BAD_UPLOADS = {
    "one column": ({"train": "Rahim\nB-PER\n"}, "train", "expected “token label”"),
    "not IOB2": ({"train": "Rahim PERSON\nwent O\n"}, "train", "is not IOB2"),
    "csv of three columns": ({"task": "text", "train": "a,b,c\n", "test": CSV_TEST}, "train", "expected two columns"),
    "empty text": ({"task": "text", "train": CSV_TRAIN + ",food\n", "test": CSV_TEST}, "train", "must both be filled in"),
    "test label not in train": ({"test": "Dhaka B-ORG\n"}, "test", "labels the train part never has: B-ORG"),
    "csv test label not in train": ({"task": "text", "train": CSV_TRAIN, "test": "x,sports\n"}, "test", "never has: sports"),
    "empty train": ({"train": "\n\n"}, "train", "has no examples"),
    "empty test": ({"test": ""}, "test", "The submitted file is empty"),
    "one label only": ({"train": "Rahim O\nwent O\n", "test": "Sima O\n"}, "test", "at least two different labels"),
    "latin-1": ({"train": "Jos\xe9 B-PER\nwent O\n".encode("latin-1")}, "train", "is not UTF-8"),
    "unknown task": ({"task": "regression"}, "task", "Select a valid choice"),
    "bad name": ({"name": "../../etc"}, "name", "Enter a valid"),
}


@pytest.mark.parametrize("kind", BAD_UPLOADS)
def test_a_bad_upload_gets_a_form_error_and_stores_nothing(client_for, organizer, run, tmp_path, kind):
    changes, field, message = BAD_UPLOADS[kind]
    response = upload(client_for(organizer), **changes)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and message in " ".join(errors[field]), errors
    assert not Probe.objects.exists()
    assert not (tmp_path / "media" / "probes").exists()


def test_a_part_over_the_size_limit_is_refused_before_it_is_read(client_for, organizer, run, settings):
    settings.PROBE_MAX_FILE_BYTES = 1024
    response = upload(client_for(organizer), train="Rahim B-PER\nwent O\n" * 100)
    assert response.status_code == 400 and "larger than 1 KiB" in " ".join(response.context["form"].errors["train"])
    assert not Probe.objects.exists()


def test_a_second_probe_of_the_same_name_is_refused(client_for, organizer, run):
    client = client_for(organizer)
    upload(client)
    response = upload(client)
    assert response.status_code == 400 and "already has a probe" in " ".join(response.context["form"].errors["name"])
    assert run.probes.count() == 1


@pytest.mark.parametrize("who", ["outsider", "volunteer"])
def test_an_outsider_or_volunteer_cannot_upload_or_remove_a_probe(client_for, organizer, run, outsider, volunteer, who):
    assert upload(client_for(organizer), name="kept").status_code == 302
    client = client_for({"outsider": outsider, "volunteer": volunteer}[who])
    assert upload(client, name="theirs").status_code == 403
    probe = run.probes.get()
    assert client.post(reverse("run-probe-remove", kwargs={"slug": "the-run", "pk": probe.pk})).status_code == 403
    assert list(run.probes.values_list("name", flat=True)) == ["kept"]


def test_a_draft_runs_probe_page_is_a_404_to_others(client_for, organizer, outsider):
    RunFactory(slug="draft-run", status="draft", organizers=[organizer])
    assert client_for(outsider).get(reverse("run-probes", kwargs={"slug": "draft-run"})).status_code == 404


def test_the_organizer_removes_a_probe_with_its_files(client_for, organizer, run, tmp_path):
    client = client_for(organizer)
    upload(client)
    probe = run.probes.get()
    path = tmp_path / "media" / probe.train_file.name
    assert path.exists()
    assert client.post(reverse("run-probe-remove", kwargs={"slug": "the-run", "pk": probe.pk})).status_code == 302
    assert not run.probes.exists() and not path.exists()


def test_a_parse_error_names_the_line():
    with pytest.raises(ProbeFormatError, match="line 3"):
        tokens_parse("a O\nb O\nc\n")


def test_the_demo_sets_are_the_same_on_every_call_and_put_entities_in_a_frame_the_corpus_lacks():
    assert entity_sets(n_train=60, n_test=20) == entity_sets(n_train=60, n_test=20)
    assert kind_sets(n_train=60, n_test=20) == kind_sets(n_train=60, n_test=20)
    framed = [sentence for sentence in entity_sets(n_train=300, n_test=0)[0].split("\n\n") if "en:likes" in sentence]
    tags = {line.split()[1] for sentence in framed for line in sentence.splitlines() if line.split()[0] != "en:likes"}
    assert {"B-PER", "B-LOC"} <= tags
