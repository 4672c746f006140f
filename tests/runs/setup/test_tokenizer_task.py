"""The run's tokenizer: trained by a Celery task on the run's data, or uploaded; tried on the page."""

import logging

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from tokenizers import Tokenizer

from peer_agent.tokenizer import tokenizer_as_transformers
from portal.logs import LogContext
from runs.setup.corpus import corpus_lines
from runs.setup.services import data_file_add, tokenizer_train_task
from tests.factories import RunFactory

BENGALI = "আমি বাংলায় গান গাই। কৃষ্ণচূড়া ফুলের রং লাল।"


def draft_run_with_data(organizer):
    run = RunFactory(status="draft", tokenizer_status="missing", organizers=[organizer])
    run.config["tokenizer"]["vocab_size"] = 800
    run.save()
    data_file_add(run=run, actor=organizer, name="corpus.txt", content="\n".join(corpus_lines(n_lines=1500)).encode())
    return run


def test_the_organizer_trains_a_tokenizer_that_transformers_loads(client_for, organizer, django_capture_on_commit_callbacks):
    run = draft_run_with_data(organizer)
    with django_capture_on_commit_callbacks(execute=True):
        client_for(organizer).post(reverse("run-tokenizer-train", args=[run.slug]))
    run.refresh_from_db()
    assert run.tokenizer_status == "ready", run.tokenizer_error
    tokenizer = Tokenizer.from_str(run.tokenizer_file.read().decode())
    assert 100 < tokenizer.get_vocab_size() <= 800
    fast = tokenizer_as_transformers(tokenizer)
    encoded = fast("আমি বাংলায় গান গাই।", "সে বই পড়ে।")
    assert encoded["input_ids"][0] == fast.cls_token_id
    sentence = next(line for line in corpus_lines(n_lines=50) if "।" in line)
    assert fast.decode(fast(sentence, add_special_tokens=False)["input_ids"]) == sentence, "Bengali round-trips"


def test_trying_the_tokenizer_keeps_every_bengali_vowel_sign(client_for, organizer):
    run = draft_run_with_data(organizer)
    tokenizer_train_task.delay(run.pk)
    page = client_for(organizer).get(run.get_absolute_url(), {"try": BENGALI}).content.decode()
    tried = page.split('id="tokens-tried">')[1].split("</p>")[0]
    for sign in "ািীুূৃেো্":
        assert BENGALI.count(sign) <= tried.count(sign), sign


def test_a_tokenizer_cannot_train_without_data(client_for, organizer):
    run = RunFactory(status="draft", tokenizer_status="missing", organizers=[organizer])
    page = client_for(organizer).post(reverse("run-tokenizer-train", args=[run.slug]), follow=True).content.decode()
    assert "upload the run" in page
    run.refresh_from_db()
    assert run.tokenizer_status == "missing"


def test_an_uploaded_tokenizer_is_validated(client_for, organizer):
    run = RunFactory(status="draft", tokenizer_status="missing", organizers=[organizer])
    client = client_for(organizer)
    page = client.post(reverse("run-tokenizer-upload", args=[run.slug]),
                       {"file": SimpleUploadedFile("t.json", b"{}")}, follow=True)
    assert "not a tokenizer" in page.content.decode()
    run.refresh_from_db()
    assert run.tokenizer_status == "missing"

    trained = draft_run_with_data(organizer)
    tokenizer_train_task.delay(trained.pk)
    trained.refresh_from_db()
    good = SimpleUploadedFile("tokenizer.json", trained.tokenizer_file.read())
    client.post(reverse("run-tokenizer-upload", args=[run.slug]), {"file": good})
    run.refresh_from_db()
    assert run.tokenizer_status == "ready"


def test_the_tokenizer_is_locked_once_the_run_starts(client_for, organizer):
    run = RunFactory(status="active", organizers=[organizer])
    page = client_for(organizer).post(reverse("run-tokenizer-train", args=[run.slug]), follow=True).content.decode()
    assert "cannot change once the run has started" in page


def test_the_tasks_log_lines_carry_the_task_id_and_the_run(organizer):
    # As an organizer matches a failed or slow tokenizer to the worker's log lines (portal/celery.py).
    run = draft_run_with_data(organizer)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.addFilter(LogContext())
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    try:
        result = tokenizer_train_task.apply(args=[run.pk])
    finally:
        logging.getLogger().removeHandler(handler)
    trained = [record for record in records if record.name == "runs.setup.services"]
    assert trained and {(record.run, record.request_id) for record in trained} == {(run.slug, result.id)}
    after = logging.makeLogRecord({})
    LogContext().filter(after)
    assert after.request_id is None and after.run is None, "the task's context ends with it"
