"""Boards across runs, volunteer profiles and the daily statistics dumps: who is shown, to whom."""

import csv
import gzip
import io
import json

import pytest

from accounts.services import team_create, team_join
from runs import tasks
from runs.credit import rollup
from runs.credit.rollup import credit_rollup
from tests.factories import NOW, RunFactory, UserFactory, report, session_for

DAY = NOW.date().isoformat()



@pytest.fixture
def volunteers(db, clock):
    """A run where a public, an anonymous and a hidden volunteer (in a team with the public one) contributed."""
    run = RunFactory(slug="credit-run")
    amina = UserFactory(username="amina", display_name="Amina R.")
    shy = UserFactory(username="shy", visibility="anonymous")
    ghost = UserFactory(username="ghost", display_name="Ghostly", visibility="hidden")
    team = team_create(founder=amina, name="Dhaka Compute")
    team_join(user=ghost, team=team)
    report(session_for(run, amina, machine="amina's desktop"), 300)
    report(session_for(run, shy), 200)
    report(session_for(run, ghost, machine="ghost box"), 100)
    credit_rollup()
    return run, amina, shy, ghost


def test_the_board_across_runs_shows_pseudonyms_and_never_hidden_names(client, volunteers):
    run, amina, shy, ghost = volunteers
    rows = client.get("/api/v1/leaderboard").json()
    assert [(row["rank"], row["name"]) for row in rows] == [(1, "Amina R."), (2, shy.pseudonym)]
    assert rows[0]["share"] == pytest.approx(300 / 600), "the hidden volunteer counts in the total"
    assert rows[0]["credit"] == pytest.approx(300 * rollup.run_credit_per_sample(run))
    assert rows[1]["profile_url"] == f"/volunteers/{shy.pseudonym}/"
    text = json.dumps(rows) + client.get("/leaderboard/").content.decode()
    assert "Ghostly" not in text and "ghost" not in text and ">shy<" not in text
    assert 'href="/volunteers/amina/"' in text


def test_teams_count_their_hidden_members(client, volunteers):
    rows = client.get("/api/v1/leaderboard?by=team&window=24h").json()
    assert [(row["name"], row["samples"]) for row in rows] == [("Dhaka Compute", 400)]
    page = client.get("/leaderboard/?by=team&window=7d").content.decode()
    assert "Dhaka Compute" in page and 'href="/teams/' in page


@pytest.mark.parametrize("query, field", [
    ("by=planet", "by"), ("window=1y", "window"), ("limit=0", "limit"), ("limit=100000", "limit"), ("offset=-1", "offset"),
    ("limit=ten", "limit"),
])
def test_board_queries_are_validated_with_a_reason(client, volunteers, query, field):
    for path in ("/api/v1/leaderboard", "/api/v1/runs/credit-run/leaderboard"):
        response = client.get(f"{path}?{query}")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_request" and field in response.json()["error"]["detail"]


def test_boards_page_by_offset(client, volunteers):
    rows = client.get("/api/v1/runs/credit-run/leaderboard?limit=1&offset=1").json()
    assert [(row["rank"], row["samples"]) for row in rows] == [(2, 200)]


def test_a_hidden_volunteers_profile_exists_only_for_themselves(client_for, volunteers, outsider):
    run, amina, shy, ghost = volunteers
    for viewer in (None, outsider, amina):
        assert client_for(viewer).get("/volunteers/ghost/").status_code == 404
        response = client_for(viewer).get("/api/v1/volunteers/ghost/contributions")
        assert response.status_code == 404 and response.json()["error"]["code"] == "volunteer_not_found"
    own = client_for(ghost).get("/volunteers/ghost/")
    assert own.status_code == 200 and "ghost box" in own.content.decode()
    assert client_for(ghost).get("/api/v1/volunteers/ghost/contributions").json()[0]["samples"] == 100


def test_an_anonymous_volunteer_is_found_by_pseudonym_only(client_for, volunteers, outsider):
    run, amina, shy, ghost = volunteers
    assert client_for(outsider).get("/volunteers/shy/").status_code == 404, "the username would unmask them"
    page = client_for(outsider).get(f"/volunteers/{shy.pseudonym}/")
    assert page.status_code == 200 and page.context["name"] == shy.pseudonym
    assert ">shy<" not in page.content.decode() and "laptop" not in page.content.decode()


def test_machines_are_shown_to_their_owner_only(client_for, volunteers, outsider):
    run, amina, shy, ghost = volunteers
    public = client_for(outsider).get("/volunteers/amina/")
    assert public.status_code == 200 and run.name in public.content.decode()
    assert "amina&#x27;s desktop" not in public.content.decode() and public.context["machines"] is None
    own = client_for(amina).get("/volunteers/amina/")
    assert [(machine["name"], machine["samples"]) for machine in own.context["machines"]] == [("amina's desktop", 300)]


def test_a_volunteers_daily_contributions_as_json(client, volunteers):
    run, amina, shy, ghost = volunteers
    days = client.get("/api/v1/volunteers/amina/contributions").json()
    assert days == [{"day": DAY, "samples": 300, "credit": pytest.approx(300 * rollup.run_credit_per_sample(run))}]


def _read(folder, name: str):
    content = gzip.decompress((folder / name).read_bytes()).decode()
    return json.loads(content) if name.endswith(".json.gz") else list(csv.DictReader(io.StringIO(content)))


def test_the_daily_dump_lists_credit_and_leaves_hidden_volunteers_out(client, volunteers, settings):
    run, amina, shy, ghost = volunteers
    folder = settings.MEDIA_ROOT / "stats" / DAY
    assert tasks.stats_dump_task(DAY) == str(folder)
    cps = rollup.run_credit_per_sample(run)
    users = _read(folder, "users.json.gz")
    assert [(user["name"], user["team"]) for user in users] == [("Amina R.", "Dhaka Compute"), (shy.pseudonym, "")]
    assert [row["name"] for row in _read(folder, "users.csv.gz")] == ["Amina R.", shy.pseudonym]
    teams = _read(folder, "teams.json.gz")
    assert teams == [{**teams[0], "name": "Dhaka Compute", "members": 2, "credit": pytest.approx(400 * cps)}]
    assert [(row["run"], row["name"], row["samples"]) for row in _read(folder, "runs.csv.gz")] == [
        ("credit-run", "Amina R.", "300"), ("credit-run", shy.pseudonym, "200")]
    for name in ("users", "teams", "runs"):
        for fmt in ("json.gz", "csv.gz"):
            text = gzip.decompress((folder / f"{name}.{fmt}").read_bytes()).decode()
            assert "ghost" not in text.lower() and "shy," not in text
    first = (folder / "users.json.gz").read_bytes()
    tasks.stats_dump_task(DAY)
    assert (folder / "users.json.gz").read_bytes() == first, "the task can run again"

    listing = client.get("/api/v1/stats").json()
    assert listing[0]["day"] == DAY and {file["name"] for file in listing[0]["files"]} == {
        f"{kind}.{fmt}" for kind in ("users", "teams", "runs", "evaluations") for fmt in ("json.gz", "csv.gz")}
    download = client.get(f"/stats/{DAY}/users.csv.gz")
    assert download.status_code == 200 and gzip.decompress(b"".join(download.streaming_content)).startswith(b"name,")
    assert "users.csv.gz" in client.get("/stats/").content.decode()
    for bad in (f"/stats/{DAY}/secret.txt", "/stats/2026-13-01/users.csv.gz", f"/stats/{DAY}/..%2Fusers.csv.gz"):
        assert client.get(bad).status_code == 404


def test_private_runs_stay_out_of_the_dump(volunteers, settings):
    secret_run = RunFactory(slug="secret-run", visibility="invite")
    report(session_for(secret_run, UserFactory(username="insider")), 50)
    credit_rollup()
    folder = settings.MEDIA_ROOT / "stats" / DAY
    tasks.stats_dump_task(DAY)
    assert {row["run"] for row in _read(folder, "runs.json.gz")} == {"credit-run"}
