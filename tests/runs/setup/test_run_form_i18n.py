"""The run form in the reader's language: a label and a help for every field of the run configuration
(the English help is the schema's own description), and its errors, pydantic's and the cross-field
ones, worded again in Bengali with Bengali digits."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import translation

from peer_agent import protocol
from peer_agent.protocol import RunConfig
from runs.setup.config_labels import FIELDS
from runs.setup.forms import ERRORS, SECTIONS, RunForm, preset_config

pytestmark = pytest.mark.django_db


def run_form_data(**changes) -> dict:
    initial = RunForm.initial_from(config=preset_config("tiny"))
    data = {key: value for key, value in initial.items() if value is not None and value is not False}
    return {**data, "name": "Bangla ALBERT", "slug": "bangla", "visibility": "public", **changes}


def schema_fields() -> dict[str, str]:
    return {f"{section}.{name}": info.description for section in SECTIONS
            for name, info in RunConfig.model_fields[section].annotation.model_fields.items()}


def test_every_configuration_field_has_a_label_and_the_schemas_help():
    assert set(FIELDS) == set(schema_fields())
    with translation.override("en"):
        assert {path: str(help_text) for path, (_, help_text) in FIELDS.items()} == schema_fields()


def test_every_cross_field_problem_of_the_schema_is_worded_for_the_form():
    kinds = set(re.findall(r'_problem\(\s*"(\w+)"', Path(protocol.__file__).read_text()))
    assert kinds and kinds <= set(ERRORS), kinds - set(ERRORS)


@pytest.fixture
def bengali_client(client_for, organizer):
    client = client_for(organizer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    return client


def test_the_form_reads_bengali(bengali_client):
    page = bengali_client.get(reverse("run-create")).content.decode()
    assert "লক্ষ্য ব্যাচের আকার" in page and "প্রতিটি অপটিমাইজার ধাপে সব পিয়ার মিলে যত নমুনা জড়ো করে।" in page
    assert "ক্রেডিট যাচাই" in page, "section titles"


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"training__warmup_steps": "9000", "training__total_steps": "5000"}, "training__warmup_steps",
     "মোট ধাপের (৫০০০) চেয়ে কম হতে হবে।"),
    ({"training__target_batch_size": "4"}, "training__target_batch_size", "= ৮)"),
    ({"training__learning_rate": "2"}, "training__learning_rate", "সর্বোচ্চ ১ হতে পারে।"),
    ({"averaging__averaging_timeout": "1", "averaging__matchmaking_time": "2.5"}, "averaging__averaging_timeout",
     "ম্যাচমেকিংয়ের সময়ের (২.৫ সে.) চেয়ে বেশি হতে হবে।"),
    ({"model__preset": "custom"}, "model__hidden_size", "প্রিসেট “custom” হলে এটি দিতে হবে।"),
])
def test_an_invalid_config_is_refused_in_bengali_beside_its_field(bengali_client, change, field, message):
    response = bengali_client.post(reverse("run-create"), run_form_data(**change))
    assert response.status_code == 200
    errors = re.search(rf'id="{field}-errors">(.*?)</div>', response.content.decode(), re.S).group(1)
    assert message in errors
