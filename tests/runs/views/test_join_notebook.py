"""The join page offers the run as a Jupyter notebook: it installs this portal's agent, asks for the token
with getpass and joins; it holds no secret (runs/views/notebook.py). Executed in a real kernel against a
live portal in tests/e2e/test_join_notebook.py."""

import re

import nbformat
from django.core.management import call_command

from runs.models import Run
from tests.factories import RunFactory


def notebook_of(client, slug: str):
    response = client.get(f"/runs/{slug}/join/notebook.ipynb")
    assert response.status_code == 200, response.status_code
    assert response["Content-Disposition"] == f'attachment; filename="{slug}-join.ipynb"'
    notebook = nbformat.reads(response.content.decode(), as_version=4)
    nbformat.validate(notebook)
    return notebook


def test_the_join_page_links_a_notebook_that_installs_this_portals_agent_and_asks_for_the_token(
    client_for, volunteer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path
    call_command("agent_wheel", verbosity=0)
    run = RunFactory()
    page = client_for(volunteer).get(f"/runs/{run.slug}/join/").content.decode()
    link = re.search(r'id="join-notebook" download href="([^"]+)"', page)
    assert link and link.group(1) == f"/runs/{run.slug}/join/notebook.ipynb", page

    code = [cell.source for cell in notebook_of(client_for(None), run.slug).cells if cell.cell_type == "code"]
    assert code[0] == f'PORTAL = "http://testserver"\nRUN = "{run.slug}"'
    assert re.fullmatch(r"%pip install --quiet http://testserver/agent/peer_agent-[^ ]+\.whl", code[1]), code[1]
    assert "getpass.getpass(" in code[2] and "os.environ['PEER_AGENT_TOKEN']" in code[2]
    assert "'check', '--portal', PORTAL, RUN" in code[3]
    assert code[4].endswith("join(RUN, portal=PORTAL)")


def test_without_a_built_wheel_the_notebook_installs_the_agent_from_the_package_index(client, db, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    run = RunFactory()
    code = [cell.source for cell in notebook_of(client, run.slug).cells if cell.cell_type == "code"]
    assert code[1] == "%pip install --quiet peer-agent"


def test_a_members_only_runs_notebook_is_not_found_for_an_outsider(client_for, outsider, organizer):
    run = RunFactory(visibility="invite", audience=Run.Audience.MEMBERS, organizers=[organizer])
    assert client_for(outsider).get(f"/runs/{run.slug}/join/notebook.ipynb").status_code == 404
    assert client_for(None).get(f"/runs/{run.slug}/join/notebook.ipynb").status_code == 404
    notebook_of(client_for(organizer), run.slug)


def test_a_run_name_with_markup_and_quotes_stays_text_in_the_notebook(client, db):
    run = RunFactory(name='<script>alert("x")</script> \'quoted\'')
    notebook = notebook_of(client, run.slug)
    assert notebook.cells[0].cell_type == "markdown" and "<script>" not in notebook.cells[0].source
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in notebook.cells[0].source
    assert notebook.cells[1].source.endswith(f'RUN = "{run.slug}"')
