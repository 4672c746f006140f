from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from runs.models import Run


def run_detail(request: HttpRequest, slug: str) -> HttpResponse:
    run = get_object_or_404(Run.objects.prefetch_related("organizers"), slug=slug)
    is_organizer = request.user.is_authenticated and run.organizers.filter(pk=request.user.pk).exists()
    if run.status == Run.Status.DRAFT and not (is_organizer or request.user.is_staff):
        raise Http404("no such run")
    return render(request, "runs/run_detail.html", {"run": run, "is_organizer": is_organizer})
