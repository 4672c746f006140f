"""A run's join notebook: the join page's steps as a Jupyter notebook, for volunteers who compute in a hosted
notebook or a plain Jupyter kernel. It holds no secret: the agent token is asked for with ``getpass`` when
it runs, so the notebook may be shared and its outputs never show the token (peer_agent/notebook.py)."""

import html
import json

import nbformat
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.translation import gettext as _
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from runs.access.rules import visible_run
from runs.models import Run
from runs.views.pages import agent_package


def join_notebook(*, run: Run, portal_url: str) -> str:
    """The notebook's JSON: install the agent from this portal, ask for the token, check the machine, join."""
    notebook = new_notebook(cells=[
        new_markdown_cell("\n\n".join([
            # Markdown renders HTML: the name an organizer chose stays text.
            "# " + _("Join “%(name)s”") % {"name": html.escape(run.name)},
            _("Run the cells in order. The third asks for an agent token: create one on the run's join page "
              "(%(url)s) and paste it; it is not shown and not saved in this notebook.") % {
                "url": f"{portal_url}/runs/{run.slug}/join/"},
            _("The last cell trains until you interrupt the kernel (■): the agent then sends its last reports "
              "and leaves the swarm. Your reported work is kept; running the cell again starts a new session. "
              "On a hosted notebook, choose a GPU runtime if you have one."),
        ])),
        new_code_cell(f"PORTAL = {json.dumps(portal_url)}\nRUN = {json.dumps(run.slug)}"),
        new_code_cell(f"%pip install --quiet {agent_package(portal_url)}"),
        new_code_cell("import getpass\nimport os\n\n"
                      f"os.environ['PEER_AGENT_TOKEN'] = getpass.getpass({json.dumps(_('Agent token (not shown): '))})"),
        new_code_cell("from peer_agent.cli import main as peer_agent\n\n"
                      "peer_agent(['check', '--portal', PORTAL, RUN])  # device, precision, bandwidth"),
        new_code_cell("from peer_agent.notebook import join\n\njoin(RUN, portal=PORTAL)"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    return nbformat.writes(notebook)


def run_join_notebook(request: HttpRequest, slug: str) -> HttpResponse:
    """The run's join notebook, for whoever may see its join page."""
    code = request.GET.get("code") or ""
    run = visible_run(slug=slug, user=request.user, joining=True, join_code=code)
    if run is None:
        raise Http404("no such run")
    text = join_notebook(run=run, portal_url=request.build_absolute_uri("/").rstrip("/"))
    response = HttpResponse(text, content_type="application/x-ipynb+json")
    response["Content-Disposition"] = f'attachment; filename="{run.slug}-join.ipynb"'
    return response
