"""Organizers configure runs in the browser forms; the lifecycle and moderation are audited."""

import pytest
from django.urls import reverse

from runs.models import Run, RunEvent
from runs.setup.forms import RunForm, preset_config
from tests.factories import RunFactory, UserFactory
from tests.runs.run_forms import run_form_data


def test_an_organizer_creates_a_draft_run_from_a_preset(client_for, organizer):
    response = client_for(organizer).post(reverse("run-create"), run_form_data("large"))
    assert response.status_code == 302
    run = Run.objects.get(slug="bengali-albert")
    assert run.status == "draft"
    assert list(run.organizers.all()) == [organizer]
    assert run.config["model"]["preset"] == "large"
    assert run.authority_public_key.startswith("ssh-rsa ")
    assert bytes(run.authority_private_key) and b"PRIVATE KEY" not in bytes(run.authority_private_key)
    assert run.events.get().kind == "created"


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"training__target_batch_size": "4"}, "training__target_batch_size", "Must be at least one peer"),
        ({"training__warmup_steps": "9000", "training__total_steps": "5000"}, "training__warmup_steps", ""),
        ({"model__preset": "gigantic"}, "model__preset", "Select a valid choice"),
        ({"model__preset": "custom"}, "model__hidden_size", ""),
    ],
)
def test_an_invalid_config_shows_the_error_beside_the_field(client_for, organizer, change, field, message):
    response = client_for(organizer).post(reverse("run-create"), run_form_data(**change))
    page = response.content.decode()
    assert response.status_code == 200
    assert f'id="{field}-errors"' in page
    assert message in page
    assert not Run.objects.exists()


def test_every_config_field_has_help_text_in_the_form(client_for, organizer):
    form = RunForm()
    assert all(form.fields[name].help_text for name in form.paths)
    page = client_for(organizer).get(reverse("run-create") + "?preset=large").content.decode()
    assert "Samples all peers gather per optimizer step." in page


def test_only_organizers_may_create_runs(client_for, volunteer):
    assert client_for(volunteer).get(reverse("run-create")).status_code == 403
    assert client_for(None).get(reverse("run-create")).status_code == 302


def test_an_active_run_only_lets_mid_run_safe_fields_change(client_for, organizer):
    run = RunFactory(organizers=[organizer])
    data = run_form_data(**{"training__target_batch_size": "128", "averaging__matchmaking_time": "3.5"})
    client_for(organizer).post(reverse("run-edit", args=[run.slug]), data)
    run.refresh_from_db()
    assert run.config["training"]["target_batch_size"] == 64, "locked while active: the posted value is ignored"
    assert run.config["averaging"]["matchmaking_time"] == 3.5
    assert run.events.get(kind="config_changed").detail == "averaging.matchmaking_time"
    page = client_for(organizer).get(reverse("run-edit", args=[run.slug])).content.decode()
    assert "only settings that are safe to change mid-run can be edited" in page


def test_lifecycle_draft_active_paused_finished_is_audited(client_for, organizer):
    run = RunFactory(status="draft", organizers=[organizer], config=preset_config("large").model_dump(mode="json"),
                     sources_check="passed")  # the worker found its hub sources load
    client = client_for(organizer)
    steps = [("activate", "active"), ("pause", "paused"), ("resume", "active"), ("pause", "paused"), ("finish", "finished")]
    for action, status in steps:
        client.post(reverse("run-action", args=[run.slug, action]))
        run.refresh_from_db()
        assert run.status == status
    kinds = list(run.events.order_by("at", "id").values_list("kind", "actor__username"))
    assert kinds == [("activated", "olga"), ("paused", "olga"), ("resumed", "olga"), ("paused", "olga"), ("finished", "olga")]


def test_an_impossible_transition_is_refused_with_a_message(client_for, organizer):
    run = RunFactory(status="finished", organizers=[organizer])
    response = client_for(organizer).post(reverse("run-action", args=[run.slug, "resume"]), follow=True)
    assert "a finished run cannot resume" in response.content.decode()


def test_a_run_cannot_start_without_its_data_and_tokenizer(client_for, organizer):
    run = RunFactory(status="draft", organizers=[organizer], tokenizer_status="missing")
    response = client_for(organizer).post(reverse("run-action", args=[run.slug, "activate"]), follow=True)
    assert "needs a tokenizer" in response.content.decode()
    run.refresh_from_db()
    assert run.status == "draft"


@pytest.mark.parametrize("action", ["activate", "pause", "resume", "finish"])
def test_volunteers_and_other_organizers_cannot_change_a_run(client_for, organizer, volunteer, action):
    other_organizer = UserFactory(organizer=True)
    run = RunFactory(status="active", organizers=[organizer])
    for user in (volunteer, other_organizer):
        assert client_for(user).post(reverse("run-action", args=[run.slug, action])).status_code == 403
    assert client_for(None).post(reverse("run-action", args=[run.slug, action])).status_code == 302
    run.refresh_from_db()
    assert run.status == "active"


def test_a_co_organizer_has_the_same_powers(client_for, organizer):
    co_organizer = UserFactory(organizer=True)
    run = RunFactory(status="active", organizers=[organizer, co_organizer])
    client_for(co_organizer).post(reverse("run-action", args=[run.slug, "pause"]))
    run.refresh_from_db()
    assert run.status == "paused"


def test_ban_and_unban_are_audited(client_for, organizer, volunteer):
    run = RunFactory(organizers=[organizer])
    client = client_for(organizer)
    client.post(reverse("run-ban", args=[run.slug]), {"username": "vik", "reason": "reports twice his samples"})
    assert run.bans.filter(user=volunteer).exists()
    client.post(reverse("run-unban", args=[run.slug]), {"username": "vik"})
    assert not run.bans.exists()
    assert [event.kind for event in run.events.order_by("at", "id")] == [RunEvent.Kind.BANNED, RunEvent.Kind.UNBANNED]


def test_an_organizer_cannot_be_banned_from_their_run(client_for, organizer):
    co_organizer = UserFactory(organizer=True)
    run = RunFactory(organizers=[organizer, co_organizer])
    client_for(organizer).post(reverse("run-ban", args=[run.slug]), {"username": co_organizer.username})
    assert not run.bans.exists()


def test_the_run_page_summarizes_the_config_for_everyone(client, db):
    run = RunFactory(description="<b>Bengali</b> for everyone", config=preset_config("large").model_dump(mode="json"))
    page = client.get(run.get_absolute_url()).content.decode()
    assert "hidden 1,024, 24 layers sharing weights, 16 heads" in page
    assert "&lt;b&gt;Bengali&lt;/b&gt;" in page
    assert "4,096 samples per collaborative step" in page


def test_drafts_are_hidden_from_everyone_but_organizers(client_for, organizer, volunteer):
    run = RunFactory(status="draft", organizers=[organizer])
    assert client_for(volunteer).get(run.get_absolute_url()).status_code == 404
    assert client_for(volunteer).get(reverse("run-edit", args=[run.slug])).status_code == 404
    assert client_for(organizer).get(reverse("run-edit", args=[run.slug])).status_code == 200


def test_uploaded_data_must_be_utf8_text_within_the_limit(client_for, organizer):
    from django.core.files.uploadedfile import SimpleUploadedFile

    run = RunFactory(status="draft", organizers=[organizer])
    client = client_for(organizer)
    bad = client.post(reverse("run-data-upload", args=[run.slug]),
                      {"file": SimpleUploadedFile("x.txt", b"\xff\xfe\x00bad")}, follow=True)
    assert "not UTF-8 text" in bad.content.decode()
    good = SimpleUploadedFile("bn.txt", "আমি বাংলায় গান গাই।\nসে বই পড়ে।\n".encode())
    client.post(reverse("run-data-upload", args=[run.slug]), {"file": good})
    data_file = run.data_files.get()
    assert (data_file.lines, data_file.name) == (2, "bn.txt")
