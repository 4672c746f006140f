"""The run health page: for organizers in full, for everyone who may see the run, without
moderation details."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from runs.access.rules import run_is_organizer
from runs.swarm.health import run_health
from runs.views.pages import visible_run_or_404


def run_health_page(request: HttpRequest, slug: str) -> HttpResponse:
    run = visible_run_or_404(request, slug)
    organizer = run_is_organizer(run=run, user=request.user)
    health = run_health(run=run, organizer=organizer)
    context = {
        "run": run,
        "is_organizer": organizer,
        "health": health,
        "markers": [marker.as_json() for marker in health["markers"]],
    }
    return render(request, "runs/health.html", context)
