"""An organizer's upload that the portal's parsers cannot read is refused with a form error that says
why, never a 500: a tokenizer.json nested deeper than Python's stack, a probe CSV with a cell longer
than the csv module takes (an unclosed quote makes one) or a stray carriage return."""

import csv

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from runs.models import Probe, Run
from tests.factories import RunFactory

# json.loads recurses once per level: this is far deeper than the interpreter's recursion limit.
DEEP_JSON = b'{"model": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
CSV_TEST = b"text,label\nRahim eats rice.,food\nSima reads.,reading\n"


def test_a_tokenizer_json_nested_too_deep_is_refused_with_a_reason(world, client_for):
    run = RunFactory(slug="draft-run", status=Run.Status.DRAFT, tokenizer_status=Run.TokenizerStatus.MISSING,
                     organizers=[world.users["olga"]])
    page = client_for(world.users["olga"]).post(
        reverse("run-tokenizer-upload", args=[run.slug]), {"file": SimpleUploadedFile("tokenizer.json", DEEP_JSON)},
        follow=True)
    assert page.status_code == 200
    assert "nested too deeply" in " ".join(str(message) for message in page.context["messages"])
    run.refresh_from_db()
    assert run.tokenizer_status == Run.TokenizerStatus.MISSING


@pytest.mark.parametrize(("train", "reason"), [
    (b"text,label\n" + b"x" * (csv.field_size_limit() + 1) + b",food\nSima reads.,reading\n",
     "line 2 cannot be read as CSV (field larger than field limit (131072)); a text may have at most 131,072 characters"),
    # The quote opened on line 2 runs on until the cell is past the limit.
    (b'text,label\n"Rahim eats rice.,food\n' + b"Sima reads.,reading\n" * 10_000, "and a quote must be closed."),
    (b"text,label\nRahim\reats rice.,food\nSima reads.,reading\n", "row 2: expected two columns, text and label; found 1."),
])
def test_a_probe_csv_the_csv_reader_refuses_is_a_form_error_saying_where(world, client_for, train, reason):
    page = client_for(world.users["olga"]).post(reverse("run-probes", args=[world.values["public"]]), {
        "name": "topics-2", "task": Probe.Task.TEXT,
        "train": SimpleUploadedFile("train.csv", train), "test": SimpleUploadedFile("test.csv", CSV_TEST)})
    assert page.status_code == 400
    (error,) = page.context["form"].errors["train"]
    assert error.startswith("The train part, ") and reason in error
    assert not Probe.objects.filter(name="topics-2").exists()
