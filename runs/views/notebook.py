"""`GET /runs/<slug>/join/notebook.ipynb`: the run's join notebook (runs/setup/notebooks.py)."""

from django.http import Http404, HttpRequest, HttpResponse

from runs.access.rules import visible_run
from runs.setup.notebooks import join_notebook
from runs.views.pages import agent_package


def run_join_notebook(request: HttpRequest, slug: str) -> HttpResponse:
    """The run's join notebook, for whoever may see its join page."""
    code = request.GET.get("code") or ""
    run = visible_run(slug=slug, user=request.user, joining=True, join_code=code)
    if run is None:
        raise Http404("no such run")
    portal_url = request.build_absolute_uri("/").rstrip("/")
    text = join_notebook(run=run, portal_url=portal_url, package=agent_package(portal_url))
    response = HttpResponse(text, content_type="application/x-ipynb+json")
    response["Content-Disposition"] = f'attachment; filename="{run.slug}-join.ipynb"'
    return response
