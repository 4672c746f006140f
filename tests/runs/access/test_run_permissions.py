"""Every run page and action for anonymous, outsider, volunteer, banned volunteer, co-organizer,
organizer of another run and staff."""

import pytest
from django.urls import reverse

from runs.setup.services import run_ban
from tests.factories import RunFactory, UserFactory

ORGANIZER_PAGES = ["run-edit", "run-participants", "run-probes"]
ORGANIZER_ACTIONS = [
    ("run-action", {"action": "pause"}),
    ("run-ban", {}),
    ("run-unban", {}),
    ("run-allowlist", {}),
    ("run-data-upload", {}),
    ("run-tokenizer-train", {}),
    ("run-tokenizer-upload", {}),
    ("run-probes", {}),
    ("run-probe-remove", {"pk": 1}),
]


@pytest.fixture
def people(organizer, volunteer, outsider, staff):
    run = RunFactory(slug="the-run", organizers=[organizer])
    co_organizer = UserFactory(username="cora", organizer=True)
    run.organizers.add(co_organizer)
    other_organizer = UserFactory(username="otto", organizer=True)
    RunFactory(slug="other-run", organizers=[other_organizer])
    banned = UserFactory(username="bruno")
    run_ban(run=run, actor=organizer, user=banned)
    return {
        "anonymous": None, "outsider": outsider, "volunteer": volunteer, "banned": banned,
        "organizer": organizer, "co_organizer": co_organizer, "other_organizer": other_organizer, "staff": staff, "run": run,
    }


def url(name: str, kwargs: dict) -> str:
    return reverse(name, kwargs={"slug": "the-run", **kwargs})


@pytest.mark.parametrize("who", ["anonymous", "outsider", "volunteer", "banned", "other_organizer", "staff"])
@pytest.mark.parametrize("name", ORGANIZER_PAGES)
def test_organizer_pages_are_closed_to_everyone_else(client_for, people, who, name):
    response = client_for(people[who]).get(url(name, {}))
    assert response.status_code == (302 if who == "anonymous" else 403)


@pytest.mark.parametrize("who", ["organizer", "co_organizer"])
@pytest.mark.parametrize("name", ORGANIZER_PAGES)
def test_organizer_pages_open_for_the_runs_organizers(client_for, people, who, name):
    assert client_for(people[who]).get(url(name, {})).status_code == 200


@pytest.mark.parametrize("who", ["anonymous", "outsider", "volunteer", "banned", "other_organizer", "staff"])
@pytest.mark.parametrize(("name", "kwargs"), ORGANIZER_ACTIONS)
def test_organizer_actions_are_refused_to_everyone_else(client_for, people, who, name, kwargs):
    response = client_for(people[who]).post(url(name, kwargs), {"username": "vik", "usernames": "vik"})
    assert response.status_code == (302 if who == "anonymous" else 403)
    if who == "anonymous":
        assert response["Location"].startswith("/accounts/login/")
    people["run"].refresh_from_db()
    assert people["run"].status == "active"
    assert not people["run"].bans.filter(user__username="vik").exists()


@pytest.mark.parametrize("who", ["anonymous", "outsider", "volunteer", "banned", "organizer", "staff"])
def test_the_run_page_is_public(client_for, people, who):
    assert client_for(people[who]).get("/runs/the-run/").status_code == 200


def test_the_join_page_needs_a_login_and_tells_a_banned_volunteer_why(client_for, people):
    assert client_for(None).get("/runs/the-run/join/").status_code == 302
    page = client_for(people["banned"]).get("/runs/the-run/join/").content.decode()
    assert "you were banned from run" in page
    response = client_for(people["banned"]).post("/runs/the-run/join/", {"action": "token"})
    assert "Token “" not in response.content.decode(), "no token is minted for a banned volunteer"
    assert not people["banned"].agent_tokens.exists()


def test_the_join_page_gives_a_volunteer_a_run_scoped_token(client_for, people):
    response = client_for(people["volunteer"]).post("/runs/the-run/join/", {"action": "token", "machine": "laptop"})
    assert response["Cache-Control"] == "no-store"
    token = people["volunteer"].agent_tokens.get()
    assert (token.name, token.run.slug) == ("laptop", "the-run")
