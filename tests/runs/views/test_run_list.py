"""/runs/: the listed runs, newest first, searched and paged; what is not listed stays out."""

import pytest

from runs.models import Run
from runs.views.pages import RUNS_PER_PAGE
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def names(response) -> list[str]:
    return [run.name for run in response.context["page"].object_list]


def test_only_listed_started_runs_are_shown(client):
    RunFactory(name="Bangla ALBERT")
    RunFactory(name="Draft run", status=Run.Status.DRAFT)
    RunFactory(name="Unlisted run", visibility=Run.Visibility.UNLISTED)
    RunFactory(name="Members run", audience=Run.Audience.MEMBERS)
    response = client.get("/runs/")
    assert response.status_code == 200
    assert names(response) == ["Bangla ALBERT"]


def test_search_matches_name_or_description_case_blind(client):
    RunFactory(name="Bangla ALBERT", description="Bengali news and Wikipedia")
    RunFactory(name="Swahili BERT", description="East African news")
    assert names(client.get("/runs/", {"q": "bangla"})) == ["Bangla ALBERT"]
    assert names(client.get("/runs/", {"q": "WIKIPEDIA"})) == ["Bangla ALBERT"]
    assert sorted(names(client.get("/runs/", {"q": "news"}))) == ["Bangla ALBERT", "Swahili BERT"]
    page = client.get("/runs/", {"q": "tamil"})
    assert names(page) == [] and "No listed run matches “tamil”." in page.content.decode()


def test_pages_hold_a_page_of_runs_newest_first_and_a_bad_page_number_is_the_nearest_page(client):
    for n in range(RUNS_PER_PAGE + 3):
        RunFactory(name=f"Run {n:02}")
    first = client.get("/runs/")
    assert len(names(first)) == RUNS_PER_PAGE and names(first)[0] == f"Run {RUNS_PER_PAGE + 2:02}"
    assert 'rel="next"' in first.content.decode()
    second = client.get("/runs/", {"page": 2})
    assert names(second) == ["Run 02", "Run 01", "Run 00"]
    for garbled in ("x", "-1", "999", "1e9"):
        assert client.get("/runs/", {"page": garbled}).status_code == 200


def test_the_nav_and_the_home_page_lead_to_the_runs_list(client):
    RunFactory(name="Bangla ALBERT")
    home = client.get("/").content.decode()
    assert '<a href="/runs/">Runs</a>' in home and '<a href="/runs/">All runs</a>' in home
