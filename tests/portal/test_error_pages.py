"""The portal's own error pages: a reader who is refused or lost learns it in their language, in the
site's frame, and the status stays what it was."""

import pytest
from django.conf import settings
from django.template.loader import render_to_string
from django.utils import translation

from runs.models import Run
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def test_a_missing_page_says_so_in_bengali(client):
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert "পাতাটি পাওয়া যায়নি" in response.content.decode() and 'lang="bn"' in response.content.decode()


def test_a_draft_run_is_not_found_for_an_outsider_in_english_too(client_for, outsider):
    RunFactory(slug="secret-draft", status=Run.Status.DRAFT)
    response = client_for(outsider).get("/runs/secret-draft/edit/")
    assert response.status_code == 404
    main = response.content.decode().split("<main>")[1].split("</main>")[0]
    assert "Page not found" in main and "secret-draft" not in main, "nothing tells a draft from a typo"


def test_a_volunteer_refused_an_organizers_page_reads_why_in_bengali(client_for, volunteer):
    client = client_for(volunteer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    response = client.get("/runs/new/")
    assert response.status_code == 403
    assert "অনুমতি নেই" in response.content.decode()


def test_the_server_error_page_renders_without_a_request_in_the_readers_language():
    """Django renders 500.html with an empty context: the database may be what failed."""
    with translation.override("bn"):
        page = render_to_string("500.html")
    assert '<html lang="bn">' in page and "কিছু একটা ভুল হয়েছে" in page
