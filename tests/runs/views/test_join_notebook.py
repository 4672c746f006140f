"""The join page offers the run as a Jupyter notebook: it installs this portal's agent, asks for the token
with getpass and joins; it holds no secret (runs/setup/notebooks.py). Executed in a real kernel against a
live portal in tests/e2e/test_join_notebook.py."""

import re
import subprocess
import sys

import nbformat
import pytest
from django.core.management import call_command

from runs.models import Run
from runs.setup.notebooks import HOSTED_NOTEBOOK, hosted_join_notebook, join_notebook
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


def test_the_notebook_a_hosted_service_opens_is_the_portals_own_with_the_portal_and_run_typed_in():
    """notebooks/join-a-run.ipynb is what `manage.py hosted_notebook` writes, and past its first two cells it runs
    what a run's own notebook runs (executed against a live portal in tests/e2e/test_join_notebook.py)."""
    committed = HOSTED_NOTEBOOK.read_text(encoding="utf-8")
    assert committed == hosted_join_notebook(), "run `.venv/bin/python manage.py hosted_notebook` and commit the file"
    hosted = nbformat.reads(committed, as_version=4)
    nbformat.validate(hosted)
    own = nbformat.reads(join_notebook(run=RunFactory.build(slug="bengali-demo"), portal_url="https://portal.example",
                                       package="https://portal.example/agent/peer_agent-1.0-py3-none-any.whl"), as_version=4)
    assert [cell.id for cell in hosted.cells] == [cell.id for cell in own.cells]
    assert [cell.source for cell in hosted.cells[3:]] == [cell.source for cell in own.cells[3:]]
    assert hosted.cells[2].source.endswith("%pip install --quiet {WHEEL}")

    parameters = hosted.cells[1].source
    with pytest.raises(AssertionError, match="type the portal's address"):
        exec(parameters, {})  # as opened: nothing typed in yet
    typed = parameters.replace('PORTAL = ""', 'PORTAL = " https://portal.example/ "', 1).replace(
        'RUN = ""', 'RUN = "bengali-demo"', 1)
    namespace = {}
    exec(typed, namespace)
    assert (namespace["PORTAL"], namespace["RUN"]) == ("https://portal.example", "bengali-demo")


def test_the_join_page_links_the_hosted_notebook_only_where_the_portal_names_a_service(client_for, volunteer, settings):
    run = RunFactory()
    page = client_for(volunteer).get(f"/runs/{run.slug}/join/").content.decode()
    assert 'id="join-notebook-hosted"' not in page
    settings.JOIN_NOTEBOOK_HOSTED_URL = "https://colab.research.google.com/github/o/r/blob/main/notebooks/join-a-run.ipynb"
    page = client_for(volunteer).get(f"/runs/{run.slug}/join/").content.decode()
    link = re.search(r'id="join-notebook-hosted" href="([^"]+)" target="_blank" rel="noopener"', page)
    assert link and link.group(1) == settings.JOIN_NOTEBOOK_HOSTED_URL, page
    assert "<code>http://testserver</code>" in page and f"<code>{run.slug}</code>" in page


@pytest.mark.django_db(transaction=True)
def test_the_hosted_notebook_installs_the_wheel_its_portals_agent_page_links(live_server, settings, tmp_path):
    """The hosted notebook's install cell run against a live portal: it reads /agent/, and pip installs that wheel
    (into a folder of its own, without its dependencies, which this environment has)."""
    settings.MEDIA_ROOT = tmp_path / "media"
    install = nbformat.reads(hosted_join_notebook(), as_version=4).cells[2].source
    code, magic = install.rsplit("\n", 1)
    with pytest.raises(AssertionError, match="serves no agent wheel"):
        exec(code, {"PORTAL": live_server.url})
    call_command("agent_wheel", verbosity=0)
    namespace = {"PORTAL": live_server.url}
    exec(code, namespace)
    built = [path.name for path in (tmp_path / "media" / "agent").iterdir()]
    assert namespace["WHEEL"] == f"{live_server.url}/agent/{built[0]}"
    # IPython expands {WHEEL} in a magic's line as str.format does here.
    assert magic.startswith("%pip install --quiet ")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", *magic.removeprefix("%pip ").format(**namespace).split(), "--no-index", "--no-deps",
         "--target", str(tmp_path / "got")], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (tmp_path / "got" / "peer_agent" / "notebook.py").exists()
