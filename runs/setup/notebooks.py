"""A run's join notebook: the join page's steps as a Jupyter notebook, for volunteers who compute in a hosted
notebook or a plain Jupyter kernel. It holds no secret: the agent token is asked for with ``getpass`` when
it runs, so the notebook may be shared and its outputs never show the token (peer_agent/notebook.py).

The same steps for any run of any portal are kept in the repository (notebooks/join-a-run.ipynb, from
:func:`hosted_join_notebook` by `manage.py hosted_notebook`), where a hosted notebook service opens it from a
link (``JOIN_NOTEBOOK_HOSTED_URL``): the volunteer types the portal's address and the run's name in its first
cell."""

import html
import json
from pathlib import Path

import nbformat
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from runs.models import Run

HOSTED_NOTEBOOK = Path(settings.BASE_DIR) / "notebooks" / "join-a-run.ipynb"
_KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def _joining(*, parameters: str, install: str, title: str, where: str) -> str:
    """The notebook's JSON: ``parameters`` (PORTAL and RUN), ``install`` the agent, ask for the token, check
    the machine, join; ``where`` tells the volunteer where to create a token."""
    about = "\n\n".join([
        title,
        _("Run the cells in order. The third asks for an agent token: create one on the run's join page "
          "(%(url)s) and paste it; it is not shown and not saved in this notebook.") % {"url": where},
        _("The last cell trains until you interrupt the kernel (■): the agent then sends its last reports "
          "and leaves the swarm. Your reported work is kept; running the cell again starts a new session. "
          "On a hosted notebook, choose a GPU runtime if you have one."),
    ])
    token = ("import getpass\nimport os\n\n"
             f"os.environ['PEER_AGENT_TOKEN'] = getpass.getpass({json.dumps(_('Agent token (not shown): '))})")
    check = ("from peer_agent.cli import main as peer_agent\n\n"
             "peer_agent(['check', '--portal', PORTAL, RUN])  # device, precision, bandwidth")
    # Named cells: the same notebook is the same file (notebooks/join-a-run.ipynb is compared with it).
    notebook = new_notebook(cells=[
        new_markdown_cell(about, id="about"),
        new_code_cell(parameters, id="parameters"),
        new_code_cell(install, id="install"),
        new_code_cell(token, id="token"),
        new_code_cell(check, id="check"),
        new_code_cell("from peer_agent.notebook import join\n\njoin(RUN, portal=PORTAL)", id="join"),
    ], metadata=_KERNEL)
    return nbformat.writes(notebook)


def join_notebook(*, run: Run, portal_url: str, package: str) -> str:
    """The run's own notebook: this portal and this run filled in, the agent installed from ``package``
    (this portal's wheel: runs/views/pages.py, agent_package)."""
    return _joining(
        parameters=f"PORTAL = {json.dumps(portal_url)}\nRUN = {json.dumps(run.slug)}",
        install=f"%pip install --quiet {package}",
        # Markdown renders HTML: the name an organizer chose stays text.
        title="# " + _("Join “%(name)s”") % {"name": html.escape(run.name)},
        where=f"{portal_url}/runs/{run.slug}/join/")


def hosted_join_notebook() -> str:
    """The notebook for any run (notebooks/join-a-run.ipynb), in English: the portal and the run are typed
    into its first cell (a form in Colab), and the agent's wheel is read from the portal's /agent/ page."""
    with translation.override("en"):
        return _joining(
            parameters=('PORTAL = ""  #@param {type:"string"}\nRUN = ""  #@param {type:"string"}\n\n'
                        "# The portal's address and the run's name, as the run's join page shows them.\n"
                        'PORTAL, RUN = PORTAL.strip().rstrip("/"), RUN.strip()\n'
                        'assert PORTAL.startswith(("https://", "http://")) and RUN, '
                        '"type the portal\'s address (https://...) and the run\'s name above"'),
            # The wheel this portal serves, by its own URL: a package of the same name on an index is not asked for.
            install=("import re\nimport urllib.request\n\n"
                     'with urllib.request.urlopen(f"{PORTAL}/agent/", timeout=60) as page:\n'
                     '    wheel = re.search(r\'href="(peer_agent-[^"]+\\.whl)"\', page.read().decode())\n'
                     'assert wheel, "this portal serves no agent wheel: ask its organizers to build one"\n'
                     'WHEEL = f"{PORTAL}/agent/{wheel.group(1)}"\n'
                     "%pip install --quiet {WHEEL}"),
            title="# " + _("Join a run of a DeDLOC portal"),
            where="<portal>/runs/<run>/join/")


